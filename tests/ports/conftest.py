"""Fixtures for the ports and advanced-endpoint tests.

``procs`` (two procs, ``{"gpus": 2}``) is shared by the whole module set: the
tests here never kill a proc. A test that makes an actor fail spawns a fresh
actor mesh for it (a failed actor does not harm its proc). Failures that reach
the client go to a :class:`FaultRecorder` (the default hook would end pytest);
a test waits for those it causes, and any other fails it at teardown.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest

import danaus.actor
from danaus.actor import ProcMesh, this_host
from danaus.testing import FaultRecorder

TIMEOUT = 20.0


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
