"""Fixtures for the ports and advanced-endpoint tests.

``procs`` (two procs, ``{"gpus": 2}``) is shared by the whole module set: the
tests here never kill a proc. A test that makes an actor fail spawns a fresh
actor mesh for it (a failed actor does not harm its proc). Failures that reach
the client go to a :class:`FaultRecorder` (the default hook would end pytest);
a test waits for those it causes, and any other fails it at teardown.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

import pytest

import danaus.actor
from danaus.actor import MeshFailure, ProcMesh, this_host

TIMEOUT = 20.0


class FaultRecorder:
    """Stands in for ``unhandled_fault_hook``: records failures, lets tests wait for them."""

    def __init__(self) -> None:
        self.events: list[MeshFailure] = []
        self._seen = 0
        self._cond = threading.Condition()

    def __call__(self, failure: MeshFailure) -> None:
        with self._cond:
            self.events.append(failure)
            self._cond.notify_all()

    def wait(self, n: int = 1, timeout: float = TIMEOUT) -> list[MeshFailure]:
        """Block until ``n`` failures arrived in all; return them (and mark them seen)."""
        with self._cond:
            if not self._cond.wait_for(lambda: len(self.events) >= n, timeout):
                raise AssertionError(
                    f"expected {n} failure(s) to reach the client within {timeout} s, got "
                    f"{[str(e) for e in self.events]}"
                )
            self._seen = len(self.events)
            return list(self.events)

    def unseen(self) -> list[MeshFailure]:
        with self._cond:
            return self.events[self._seen :]


@pytest.fixture(autouse=True)
def faults(monkeypatch: pytest.MonkeyPatch) -> Iterable[FaultRecorder]:
    recorder = FaultRecorder()
    monkeypatch.setattr(danaus.actor, "unhandled_fault_hook", recorder)
    yield recorder
    extra = recorder.unseen()
    if extra:
        pytest.fail(f"unexpected failure(s) reached the client: {[str(f) for f in extra]}")


@pytest.fixture(scope="package")
def procs() -> Iterable[ProcMesh]:
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    assert pm.initialized.get(timeout=TIMEOUT) is True
    yield pm
    pm.stop().get(timeout=TIMEOUT)
