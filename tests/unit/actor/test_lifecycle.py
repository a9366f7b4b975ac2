"""Stopping an actor of this proc (the client process): its ``__cleanup__`` runs, and it
is freed. Stopping actors and procs elsewhere: ``tests/integration/test_lifecycle.py``."""

from __future__ import annotations

import gc
import json
import os
import weakref
from pathlib import Path
from typing import Any

import pytest

from danaus._errors import SupervisionError
from danaus.actor import Actor, endpoint, this_proc

# Bounded wait for a reply from an actor of this process: far above what one needs.
TIMEOUT = 30.0


class SyncCleanup(Actor):
    def __init__(self, out: str) -> None:
        self.out = out
        self.seen: list[int] = []

    @endpoint
    def record(self, i: int) -> None:
        self.seen.append(i)

    def __cleanup__(self, exc: BaseException | None) -> None:
        path = Path(self.out) / f"sync-{os.getpid()}"
        path.write_text(json.dumps({"exc": repr(exc), "seen": self.seen}))


def test_cleanup_of_an_actor_on_this_proc_runs_on_stop(tmp_path: Path) -> None:
    mesh = this_proc().spawn("local_cleanup", SyncCleanup, str(tmp_path))
    mesh.record.broadcast(1)
    mesh.stop().get(timeout=TIMEOUT)
    assert json.loads((tmp_path / f"sync-{os.getpid()}").read_text()) == {
        "exc": "None",
        "seen": [1],
    }


_instances: list[Any] = []


class Heavy(Actor):
    def __init__(self) -> None:
        _instances.append(weakref.ref(self))
        self.payload = bytearray(1 << 20)

    @endpoint
    def ping(self) -> int:
        return 1


@pytest.mark.timeout(60)
def test_a_stopped_actor_is_freed() -> None:
    mesh = this_proc().spawn("heavy", Heavy)
    assert mesh.ping.call_one().get(timeout=30) == 1
    mesh.stop().get(timeout=30)
    gc.collect()
    assert _instances and _instances[-1]() is None
    with pytest.raises(SupervisionError, match="stopped"):
        mesh.ping.call_one().get(timeout=30)
