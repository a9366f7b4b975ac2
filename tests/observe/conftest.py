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


def proc_names(procs: ProcMesh) -> list[str]:
    """The names of ``procs``' procs, in rank order, as ``ProcMesh.stats()`` reports them."""
    return [p.proc for p in procs.stats().get(timeout=REPLY_TIMEOUT).procs]


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


class Parent(Actor):
    """Spawns procs of its own and actors on them; handles their failures itself."""

    def __init__(self) -> None:
        self.meshes: dict[str, Any] = {}
        self.failures: list[str] = []

    @endpoint
    def spawn_children(self, name: str, n: int) -> list[str]:
        procs = this_host().spawn_procs(per_host={"gpus": n})
        workers = procs.spawn(name, Worker)
        workers.initialized.get(timeout=REPLY_TIMEOUT)
        self.meshes[name] = (procs, workers)
        return proc_names(procs)

    @endpoint
    def ping_children(self, name: str, x: int) -> list[Any]:
        return list(self.meshes[name][1].ping.call(x).get(timeout=REPLY_TIMEOUT).values())

    @endpoint
    def child_pids(self, name: str) -> list[int]:
        return list(self.meshes[name][1].pid.call().get(timeout=REPLY_TIMEOUT).values())

    @endpoint
    def stop_children(self, name: str) -> None:
        procs, _ = self.meshes.pop(name)
        procs.stop().get(timeout=REPLY_TIMEOUT)

    @endpoint
    def seen_failures(self) -> list[str]:
        return self.failures

    def __supervise__(self, failure: Any) -> bool:
        self.failures.append(str(failure))
        return True


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
