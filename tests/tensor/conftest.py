"""Shared fixtures for the tensor engine's tests.

One 2x2 mesh (``{"host": 2, "gpu": 2}``, four procs) lives for the whole
session and its tensor-engine workers with it; every test that does not
break a worker uses it. Values are always checked against the same
computation in plain local torch: shard ``(host=h, gpu=g)`` of ``base(mesh)``
holds ``torch.arange(6.) + 10 * h + g``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import danaus.actor as danaus_actor  # noqa: E402
from danaus.actor import ProcMesh, this_host  # noqa: E402

REPLY_TIMEOUT = 30.0

_faults: list[Any] = []
_fault_came = threading.Condition()


def _record(fault: Any) -> None:
    with _fault_came:
        _faults.append(fault)
        _fault_came.notify_all()


@contextlib.contextmanager
def failures_of(mesh_name: str, n: int) -> Iterator[None]:
    """The block makes actor mesh ``mesh_name`` fail: afterwards, wait (bounded) until
    ``n`` of its failures reached the client's hook, take them out of the record (the
    check after each test would fail on them), and fail unless at least one came."""
    seen = len(_faults)
    yield
    with _fault_came:
        _fault_came.wait_for(
            lambda: sum(mesh_name in str(f) for f in _faults[seen:]) >= n, REPLY_TIMEOUT
        )
        ours = [f for f in _faults[seen:] if mesh_name in str(f)]
        for f in ours:
            _faults.remove(f)
    assert ours, f"the failure of {mesh_name} should have reached the client"


@pytest.fixture(scope="session", autouse=True)
def _record_unhandled_faults() -> Iterable[list[Any]]:
    previous = danaus_actor.unhandled_fault_hook
    danaus_actor.unhandled_fault_hook = _record
    yield _faults
    danaus_actor.unhandled_fault_hook = previous


@pytest.fixture(autouse=True)
def _no_unhandled_faults(_record_unhandled_faults: list[Any]) -> Iterable[None]:
    seen = len(_record_unhandled_faults)
    yield
    new = _record_unhandled_faults[seen:]
    if new:
        pytest.fail(f"{len(new)} unhandled failure(s) reached the client: {[str(f) for f in new]}")


@pytest.fixture(scope="session")
def mesh() -> Iterable[ProcMesh]:
    """Four procs, ``{"host": 2, "gpu": 2}``, with their tensor engine, for the session."""
    pm = this_host().spawn_procs(per_host={"host": 2, "gpu": 2})
    assert pm.initialized.get(timeout=REPLY_TIMEOUT) is True
    yield pm
    pm.stop().get(timeout=REPLY_TIMEOUT)


def engine_device() -> Any:
    """The device the workers keep shards on (setting ``tensor_device``; CI: the CPU)."""
    from danaus._tensor.engine import _device

    return _device()


def base(mesh: ProcMesh) -> Any:
    """Under ``mesh`` (active): shard (h, g) holds ``arange(6.) + 10 h + g``."""
    return torch.arange(6.0) + mesh.rank("host") * 10 + mesh.rank("gpu")


def local_base(h: int, g: int) -> Any:
    return torch.arange(6.0) + 10 * h + g


COORDS = [(h, g) for h in range(2) for g in range(2)]
