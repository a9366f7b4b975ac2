"""Shared fixtures for the multi-process integration tests.

Meshes are spawned once and shared where the semantics allow: ``procs`` (two
procs, ``{"gpus": 2}``) lives for the whole session. Tests that stop or break
things spawn their own.

Cross-process synchronisation never uses sleeps. ``latch`` gives two actor
meshes on the shared procs: ``waiters.wait(key, timeout)`` blocks on a
``threading.Event`` that lives in the proc (module global), and
``releasers.release(key)`` — a *different* actor in the same proc — sets it.
Every wait is bounded, so a deadlock shows up as a ``TimeoutError``, not a hang.
"""

from __future__ import annotations

import contextlib
import os
import threading
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

import danaus.actor as danaus_actor
from danaus.actor import Actor, ProcMesh, endpoint, this_host
from danaus.testing import (  # noqa: F401  (the tests import these from here)
    ClientScript,
    client_env,
    pid_alive,
    wait_pids_gone,
)

REPO = Path(__file__).resolve().parents[2]

# Bounded wait for any single reply in these tests: far above what a healthy call needs.
REPLY_TIMEOUT = 30.0


# -- failures that reach the client ------------------------------------------------
#
# By default an unhandled actor failure ends the client (exit code 1), which here
# would end the whole pytest run. Record them instead and fail the test during
# which they arrived; no test in this suite is meant to cause one.

_faults: list[Any] = []


@pytest.fixture(scope="session", autouse=True)
def _record_unhandled_faults() -> Iterable[list[Any]]:
    if not hasattr(danaus_actor, "unhandled_fault_hook"):
        yield _faults
        return
    previous = danaus_actor.unhandled_fault_hook
    danaus_actor.unhandled_fault_hook = _faults.append
    yield _faults
    danaus_actor.unhandled_fault_hook = previous


@pytest.fixture(autouse=True)
def _no_unhandled_faults(_record_unhandled_faults: list[Any]) -> Iterable[None]:
    seen = len(_record_unhandled_faults)
    yield
    new = _record_unhandled_faults[seen:]
    if new:
        pytest.fail(f"{len(new)} unhandled failure(s) reached the client: {[str(f) for f in new]}")


# -- a latch usable across actors of one proc ---------------------------------

_LATCHES: dict[str, threading.Event] = {}
_LATCHES_LOCK = threading.Lock()


def _latch_event(key: str) -> threading.Event:
    with _LATCHES_LOCK:
        return _LATCHES.setdefault(key, threading.Event())


class Latch(Actor):
    """``wait(key)`` blocks this actor until another actor of its proc calls ``release(key)``."""

    @endpoint
    def wait(self, key: str, timeout: float = REPLY_TIMEOUT) -> bool:
        return _latch_event(key).wait(timeout)

    @endpoint
    def release(self, key: str) -> None:
        _latch_event(key).set()

    @endpoint
    def pid(self) -> int:
        return os.getpid()


class LatchPair:
    """Two meshes of :class:`Latch` on the same procs, and fresh keys.

    Every key handed out is released when the test ends, so a test that fails
    while an actor waits does not leave that actor blocked for later tests.
    """

    def __init__(self, waiters: Any, releasers: Any) -> None:
        self.waiters = waiters
        self.releasers = releasers
        self.keys: list[str] = []

    def key(self) -> str:
        key = uuid.uuid4().hex
        self.keys.append(key)
        return key

    def release(self, key: str, **where: int) -> None:
        mesh = self.releasers.slice(**where) if where else self.releasers
        mesh.release.call(key).get(timeout=REPLY_TIMEOUT)

    def release_all(self) -> None:
        for key in self.keys:
            with contextlib.suppress(Exception):
                self.release(key)

    def __reduce__(self) -> Any:
        return (LatchPair, (self.waiters, self.releasers))


@pytest.fixture(scope="session")
def procs() -> Iterable[ProcMesh]:
    """Two procs, ``{"gpus": 2}``, shared by every test that does not stop or break them."""
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    assert pm.initialized.get(timeout=REPLY_TIMEOUT) is True
    yield pm
    pm.stop().get(timeout=REPLY_TIMEOUT)


@pytest.fixture(scope="session")
def _latch_meshes(procs: ProcMesh) -> tuple[Any, Any]:
    waiters = procs.spawn("latch_waiters", Latch)
    releasers = procs.spawn("latch_releasers", Latch)
    waiters.initialized.get(timeout=REPLY_TIMEOUT)
    releasers.initialized.get(timeout=REPLY_TIMEOUT)
    return waiters, releasers


@pytest.fixture
def latch(_latch_meshes: tuple[Any, Any]) -> Iterable[LatchPair]:
    pair = LatchPair(*_latch_meshes)
    yield pair
    pair.release_all()


# -- processes ------------------------------------------------------------------


@pytest.fixture
def pids_gone() -> Callable[..., list[int]]:
    return wait_pids_gone


@pytest.fixture
def client_script(tmp_path: Path) -> Iterable[ClientScript]:
    cs = ClientScript(tmp_path)
    yield cs
    cs.close()
