"""Fixtures for the cast tree tests: tree settings small enough for a dozen procs.

Every test here runs with ``tree_min_ranks=4`` and ``tree_fanout=3``, so a
mesh of 13 real procs has a tree three hops deep. The default fault hook
ends the process; a recorder stands in for it, and a test fails at teardown
if a failure reached the client that it did not expect.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import pytest

import danaus.actor
import danaus.config
from danaus.actor import ProcMesh, this_host
from danaus.testing import FaultRecorder

TIMEOUT = 30.0
FANOUT = 3


@pytest.fixture(autouse=True)
def tree_settings() -> Iterator[None]:
    saved = danaus.config.get_runtime_config()
    danaus.config.configure(tree_min_ranks=4, tree_fanout=FANOUT)
    yield
    danaus.config.clear_runtime_config()
    danaus.config.configure(**saved)


@pytest.fixture(autouse=True)
def faults(monkeypatch: pytest.MonkeyPatch) -> Iterable[FaultRecorder]:
    recorder = FaultRecorder()
    monkeypatch.setattr(danaus.actor, "unhandled_fault_hook", recorder)
    yield recorder
    extra = recorder.unseen()
    if extra:
        pytest.fail(f"unexpected failure(s) reached the client: {[str(f) for f in extra]}")


@pytest.fixture(scope="module")
def procs13() -> Iterable[ProcMesh]:
    """13 real procs (``hosts=1, gpus=13``), shared by the tests that break nothing."""
    pm = this_host().spawn_procs(per_host={"gpus": 13})
    assert pm.initialized.get(timeout=TIMEOUT) is True
    yield pm
    pm.stop().get(timeout=TIMEOUT)


@pytest.fixture
def spawn13() -> Iterable[Callable[[], ProcMesh]]:
    """Fresh 13 procs for a test that kills some; stopped at teardown."""
    spawned: list[ProcMesh] = []

    def spawn() -> ProcMesh:
        pm = this_host().spawn_procs(per_host={"gpus": 13})
        spawned.append(pm)
        assert pm.initialized.get(timeout=TIMEOUT) is True
        return pm

    yield spawn
    for pm in spawned:
        pm.stop().get(timeout=TIMEOUT)
