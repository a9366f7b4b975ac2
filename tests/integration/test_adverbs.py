"""Adverbs: call, call_one, choose, stream, broadcast, to actors on procs. An endpoint
called without one: ``tests/unit/actor/test_semantics.py``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from danaus.actor import (
    Actor,
    ActorMesh,
    Future,
    ProcMesh,
    ValueMesh,
    context,
    current_rank,
    endpoint,
)

from .conftest import REPLY_TIMEOUT, LatchPair


class Counter(Actor):
    def __init__(self, start: int = 0) -> None:
        self.value = start
        self.hits = 0

    @endpoint
    def incr(self, by: int = 1) -> int:
        self.value += by
        return self.value

    @endpoint
    def set(self, value: int) -> None:
        self.value = value

    @endpoint
    def get(self) -> int:
        return self.value

    @endpoint
    def hit(self) -> int:
        self.hits += 1
        return context().actor_instance.rank.rank

    @endpoint
    def hit_count(self) -> int:
        return self.hits

    @endpoint
    def rank_times(self, k: int) -> int:
        return current_rank().rank * k


class Staggered(Actor):
    """Rank 0 answers only once the latch is released; rank 1 answers at once."""

    @endpoint
    def answer(self, latch: LatchPair, key: str) -> int:
        rank = current_rank().rank
        if rank == 0:
            assert latch.waiters.slice(gpus=0).wait.call_one(key).get(timeout=REPLY_TIMEOUT)
        return rank


@pytest.fixture
def counters(procs: ProcMesh) -> Iterator[ActorMesh[Counter]]:
    mesh = procs.spawn("counters", Counter, 10)
    yield mesh
    mesh.stop().get(timeout=REPLY_TIMEOUT)


def test_call_returns_a_future_of_a_value_mesh_in_rank_order(counters) -> None:
    fut = counters.rank_times.call(7)
    assert isinstance(fut, Future)
    values = fut.get(timeout=REPLY_TIMEOUT)
    assert isinstance(values, ValueMesh)
    assert values.sizes == {"gpus": 2}
    assert list(values.values()) == [0, 7]
    assert [(dict(point), v) for point, v in values.items()] == [({"gpus": 0}, 0), ({"gpus": 1}, 7)]


def test_call_on_a_slice_returns_a_value_mesh_of_the_slice(counters) -> None:
    values = counters.slice(gpus=slice(1, 2)).rank_times.call(3).get(timeout=REPLY_TIMEOUT)
    assert values.sizes == {"gpus": 1}
    # The message rank is the position inside the slice.
    assert list(values.values()) == [0]


def test_call_one_returns_the_value_of_a_single_actor(counters) -> None:
    one = counters.slice(gpus=1)
    assert one.incr.call_one(5).get(timeout=REPLY_TIMEOUT) == 15
    assert list(counters.get.call().get(timeout=REPLY_TIMEOUT).values()) == [10, 15]


def test_call_one_on_a_mesh_of_several_actors_raises_before_sending(counters) -> None:
    with pytest.raises(ValueError, match="exactly 1"):
        counters.incr.call_one(100)
    assert list(counters.get.call().get(timeout=REPLY_TIMEOUT).values()) == [10, 10]


def test_choose_sends_to_exactly_one_actor(counters) -> None:
    rank = counters.hit.choose().get(timeout=REPLY_TIMEOUT)
    assert rank in (0, 1)
    hits = counters.hit_count.call().get(timeout=REPLY_TIMEOUT)
    assert sum(hits.values()) == 1


def test_choose_eventually_reaches_every_actor(counters) -> None:
    chosen = {counters.hit.choose().get(timeout=REPLY_TIMEOUT) for _ in range(64)}
    # The chance that 64 uniform picks of 2 miss one is 2**-63.
    assert chosen == {0, 1}
    assert sum(counters.hit_count.call().get(timeout=REPLY_TIMEOUT).values()) == 64


def test_stream_yields_one_future_per_actor(counters) -> None:
    futures = list(counters.rank_times.stream(2))
    assert len(futures) == 2
    assert all(isinstance(f, Future) for f in futures)
    assert sorted(f.get(timeout=REPLY_TIMEOUT) for f in futures) == [0, 2]


@pytest.mark.timeout(45)
def test_stream_yields_replies_in_arrival_order(procs: ProcMesh, latch: LatchPair) -> None:
    staggered = procs.spawn("staggered", Staggered)
    key = latch.key()
    it = staggered.answer.stream(latch, key)
    first = next(it)
    second = next(it)
    # Rank 0 is held by the latch, so the first reply to arrive is rank 1's.
    assert first.get(timeout=REPLY_TIMEOUT) == 1
    assert not second.done()
    latch.release(key, gpus=0)
    assert second.get(timeout=REPLY_TIMEOUT) == 0
    with pytest.raises(StopIteration):
        next(it)
    staggered.stop().get(timeout=REPLY_TIMEOUT)


def test_broadcast_is_fire_and_forget_and_takes_effect(counters) -> None:
    assert counters.set.broadcast(42) is None
    assert list(counters.get.call().get(timeout=REPLY_TIMEOUT).values()) == [42, 42]


def test_broadcast_to_a_slice_reaches_only_the_slice(counters) -> None:
    counters.slice(gpus=0).incr.broadcast(5)
    assert list(counters.get.call().get(timeout=REPLY_TIMEOUT).values()) == [15, 10]
