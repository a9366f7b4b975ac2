"""Fixtures for the observing tests: a shared mesh, a dashboard, recorded failures.

Unhandled failures would end the client (and pytest with it): they are
recorded instead, and tests that kill a proc wait for theirs.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import danaus
import danaus.actor as danaus_actor
import danaus.dashboard
from danaus.actor import Actor, ProcMesh, endpoint, this_host
from danaus.testing import FaultRecorder

REPLY_TIMEOUT = 30.0

_events: dict[str, threading.Event] = {}


class Worker(Actor):
    """What the observing tests call: quick, failing, slow and pid-telling endpoints."""

    @endpoint
    def ping(self, x: Any = None) -> Any:
        return x

    @endpoint
    def boom(self) -> None:
        raise ValueError("boom on purpose")

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def nap(self, seconds: float) -> None:
        time.sleep(seconds)

    @endpoint
    def hold(self, key: str, timeout: float) -> bool:
        """Block until ``release(key)`` (another actor of this proc) or ``timeout``."""
        return _events.setdefault(key, threading.Event()).wait(timeout)

    @endpoint
    def release(self, key: str) -> None:
        _events.setdefault(key, threading.Event()).set()


@pytest.fixture(scope="session")
def faults() -> Iterator[FaultRecorder]:
    recorder = FaultRecorder()
    previous = danaus_actor.unhandled_fault_hook
    danaus_actor.unhandled_fault_hook = recorder
    yield recorder
    danaus_actor.unhandled_fault_hook = previous


@pytest.fixture(scope="module")
def procs(faults: FaultRecorder) -> Iterator[ProcMesh]:
    """Two procs ``{"gpus": 2}`` shared by a test module (nothing kills them)."""
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    pm.initialized.get(timeout=REPLY_TIMEOUT)
    yield pm
    pm.stop().get(timeout=REPLY_TIMEOUT)


@pytest.fixture(scope="module")
def dashboard(faults: FaultRecorder) -> Iterator[danaus.dashboard.Dashboard]:
    dash = danaus.dashboard.serve()
    yield dash
    dash.stop()
