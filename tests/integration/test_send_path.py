"""The caller's send path: call_one's light port and future, cached header pickles,
and the plain pattern a user writes (many calls issued, then each awaited). ``Pending``
alone: ``tests/unit/actor/test_future.py``."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from danaus.actor import Actor, ActorError, ActorMesh, ProcMesh, endpoint

from .conftest import REPLY_TIMEOUT


class Log(Actor):
    def __init__(self) -> None:
        self.seen: list[Any] = []

    @endpoint
    def add(self, x: Any) -> int:
        self.seen.append(x if not isinstance(x, np.ndarray) else ("array", int(x[0])))
        return len(self.seen)

    @endpoint
    def echo(self, x: Any) -> Any:
        return x

    @endpoint
    def boom(self, x: int) -> int:
        raise ValueError(f"no {x}")

    @endpoint
    def take(self) -> list[Any]:
        out, self.seen = self.seen, []
        return out


@pytest.fixture(scope="module")
def log(procs: ProcMesh) -> Iterator[ActorMesh[Log]]:
    mesh = procs.spawn("sendpath", Log)
    mesh.initialized.get(timeout=REPLY_TIMEOUT)
    yield mesh
    mesh.stop().get(timeout=REPLY_TIMEOUT)


# -- the plain pattern, through real procs -------------------------------------------


def test_many_call_one_on_a_slice_then_get_each_returns_every_value_in_order(log) -> None:
    one = log.slice(gpus=0)
    futs = [one.echo.call_one(i) for i in range(3_000)]
    assert [f.get(timeout=REPLY_TIMEOUT) for f in futs] == list(range(3_000))
    errs = [one.boom.call_one(i) for i in range(50)]
    for i, f in enumerate(errs):
        with pytest.raises(ActorError, match=f"no {i}"):
            f.get(timeout=REPLY_TIMEOUT)


def test_fifo_holds_across_held_small_frames_large_arguments_and_other_adverbs(log) -> None:
    one = log.slice(gpus=0)
    one.take.call_one().get(timeout=REPLY_TIMEOUT)
    futs = []
    expected: list[Any] = []
    for i in range(600):
        if i % 97 == 50:  # a large array: its frame is never held, and must not overtake
            futs.append(one.add.call_one(np.full(1 << 16, i % 256, dtype=np.uint8)))
            expected.append(("array", i % 256))
        elif i % 89 == 40:
            one.add.broadcast(i)
            expected.append(i)
        else:
            futs.append(one.add.call_one(i))
            expected.append(i)
    for f in futs:
        f.get(timeout=REPLY_TIMEOUT)
    assert one.take.call_one().get(timeout=REPLY_TIMEOUT) == expected


def test_calls_from_several_threads_all_complete(log) -> None:
    one = log.slice(gpus=0)
    out: dict[int, list[Any]] = {}

    def worker(k: int) -> None:
        futs = [one.echo.call_one((k, i)) for i in range(500)]
        out[k] = [f.get(timeout=REPLY_TIMEOUT) for f in futs]

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(REPLY_TIMEOUT)
    assert out == {k: [(k, i) for i in range(500)] for k in range(4)}
