"""Actor semantics: one message at a time, blocking inside endpoints, thread-local state,
concurrency between actors, per-sender FIFO, and argument checks at the call site. An actor
of the client's own proc beside the client's thread: ``tests/unit/actor/test_semantics.py``."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from danaus.actor import Actor, ActorMesh, ProcMesh, current_rank, endpoint

from .conftest import REPLY_TIMEOUT, LatchPair

_tls = threading.local()


class SyncRecorder(Actor):
    """Records enter/exit events; ``step_waiting`` blocks on another actor's future."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int]] = []

    @endpoint
    def step_waiting(self, latch: LatchPair, key: str, i: int) -> bool:
        self.events.append(("enter", i))
        released = latch.waiters.slice(gpus=0).wait.call_one(key).get(timeout=REPLY_TIMEOUT)
        self.events.append(("exit", i))
        return released

    @endpoint
    def step(self, i: int) -> None:
        self.events.append(("enter", i))
        self.events.append(("exit", i))

    @endpoint
    def recorded(self) -> list[tuple[str, int]]:
        return list(self.events)


class AsyncRecorder(Actor):
    def __init__(self) -> None:
        self.events: list[tuple[str, int]] = []

    @endpoint
    async def step_waiting(self, latch: LatchPair, key: str, i: int) -> bool:
        self.events.append(("enter", i))
        released = await latch.waiters.slice(gpus=0).wait.call_one(key)
        self.events.append(("exit", i))
        return released

    @endpoint
    async def step_yielding(self, i: int) -> None:
        self.events.append(("enter", i))
        for _ in range(5):
            await asyncio.sleep(0)  # yield to the loop: another message must still not run
        self.events.append(("exit", i))

    @endpoint
    async def step(self, i: int) -> None:
        self.events.append(("enter", i))
        self.events.append(("exit", i))

    @endpoint
    async def recorded(self) -> list[tuple[str, int]]:
        return list(self.events)


class ThreadState(Actor):
    @endpoint
    def remember(self, value: str) -> int:
        _tls.value = value
        return threading.get_ident()

    @endpoint
    def recall(self) -> tuple[str | None, int]:
        return getattr(_tls, "value", None), threading.get_ident()


class AsyncThreadState(Actor):
    @endpoint
    async def remember(self, value: str) -> int:
        _tls.value = value
        return threading.get_ident()

    @endpoint
    async def recall(self) -> tuple[str | None, int]:
        return getattr(_tls, "value", None), threading.get_ident()


class Log(Actor):
    def __init__(self) -> None:
        self.seen: list[int] = []

    @endpoint
    def record(self, i: int) -> int:
        self.seen.append(i)
        return i

    @endpoint
    def log(self) -> list[int]:
        return list(self.seen)


class Driver(Actor):
    """Sends an interleaving of broadcasts and calls to a mesh it was given."""

    @endpoint
    def drive(self, log: Any, n: int) -> list[list[int]]:
        pending = []
        for i in range(n):
            if i % 3 == 0:
                log.record.broadcast(i)
            elif i % 3 == 1:
                log.slice(gpus=i % 2).record.broadcast(i)
            else:
                pending.append(log.record.call(i))
        for f in pending:
            f.get(timeout=REPLY_TIMEOUT)
        return list(log.log.call().get(timeout=REPLY_TIMEOUT).values())


class Strict(Actor):
    def __init__(self) -> None:
        self.calls = 0

    @endpoint
    def take(self, a: int, b: int = 0, *, c: int = 0) -> int:
        self.calls += 1
        return a + b + c

    @endpoint
    def store(self, payload: Any) -> None:
        self.calls += 1

    @endpoint
    def count(self) -> int:
        return self.calls


@pytest.fixture
def strict(procs: ProcMesh) -> Iterator[ActorMesh[Strict]]:
    mesh = procs.spawn("strict", Strict)
    yield mesh
    mesh.stop().get(timeout=REPLY_TIMEOUT)


# -- one message at a time ----------------------------------------------------------


@pytest.mark.timeout(45)
@pytest.mark.parametrize("cls", [SyncRecorder, AsyncRecorder], ids=["sync", "async"])
def test_endpoint_waiting_on_another_actor_does_not_let_the_next_message_in(
    procs: ProcMesh, latch: LatchPair, cls: type
) -> None:
    rec = procs.slice(gpus=1).spawn(f"recorder_{cls.__name__}", cls)
    key = latch.key()
    first = rec.step_waiting.call_one(latch, key, 1)
    second = rec.step.call_one(2)
    # The first call is blocked on the latch, and the second must queue behind it.
    with pytest.raises(TimeoutError):
        second.get(timeout=0.3)
    latch.release(key, gpus=0)
    assert first.get(timeout=REPLY_TIMEOUT) is True
    second.get(timeout=REPLY_TIMEOUT)
    assert rec.recorded.call_one().get(timeout=REPLY_TIMEOUT) == [
        ("enter", 1),
        ("exit", 1),
        ("enter", 2),
        ("exit", 2),
    ]
    rec.stop().get(timeout=REPLY_TIMEOUT)


def test_async_endpoint_that_yields_to_the_loop_still_runs_to_completion_first(
    procs: ProcMesh,
) -> None:
    rec = procs.slice(gpus=0).spawn("yielding", AsyncRecorder)
    futures = [rec.step_yielding.call_one(i) for i in range(20)]
    for f in futures:
        f.get(timeout=REPLY_TIMEOUT)
    events = rec.recorded.call_one().get(timeout=REPLY_TIMEOUT)
    assert events == [e for i in range(20) for e in (("enter", i), ("exit", i))]
    rec.stop().get(timeout=REPLY_TIMEOUT)


# -- threads --------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [ThreadState, AsyncThreadState], ids=["sync", "async"])
def test_thread_local_state_persists_across_calls(procs: ProcMesh, cls: type) -> None:
    mesh = procs.spawn(f"tls_{cls.__name__}", cls)
    idents = mesh.remember.call("kept").get(timeout=REPLY_TIMEOUT)
    for _ in range(3):
        recalled = mesh.recall.call().get(timeout=REPLY_TIMEOUT)
        assert [v for v, _ in recalled.values()] == ["kept", "kept"]
        assert [t for _, t in recalled.values()] == list(idents.values())
    mesh.stop().get(timeout=REPLY_TIMEOUT)


def test_two_actors_in_one_proc_run_concurrently(latch: LatchPair) -> None:
    # The waiter blocks its own thread until a different actor of the same proc
    # releases it; if the proc ran one actor at a time, release would time out.
    key = latch.key()
    waiting = latch.waiters.wait.call(key)
    with pytest.raises(TimeoutError):
        waiting.get(timeout=0.05)
    latch.releasers.release.call(key).get(timeout=REPLY_TIMEOUT)
    assert list(waiting.get(timeout=REPLY_TIMEOUT).values()) == [True, True]


# -- ordering ---------------------------------------------------------------------------


@pytest.mark.timeout(45)
def test_messages_from_one_sender_arrive_in_order_across_adverbs_and_slices(
    procs: ProcMesh,
) -> None:
    log = procs.spawn("fifo_log", Log)
    expected: dict[int, list[int]] = {0: [], 1: []}
    pending = []
    for i in range(200):
        kind = i % 5
        if kind == 0:
            log.record.broadcast(i)
            targets = [0, 1]
        elif kind == 1:
            pending.append(log.record.call(i))
            targets = [0, 1]
        elif kind == 2:
            log.slice(gpus=1).record.broadcast(i)
            targets = [1]
        elif kind == 3:
            pending.append(log.slice(gpus=0).record.call_one(i))
            targets = [0]
        else:
            pending.extend(log.slice(gpus=slice(0, 2)).record.stream(i))
            targets = [0, 1]
        for t in targets:
            expected[t].append(i)
    logs = log.log.call().get(timeout=REPLY_TIMEOUT)
    assert list(logs.values()) == [expected[0], expected[1]]
    for f in pending:
        f.get(timeout=REPLY_TIMEOUT)
    log.stop().get(timeout=REPLY_TIMEOUT)


@pytest.mark.timeout(45)
def test_messages_from_an_actor_sender_arrive_in_order(procs: ProcMesh) -> None:
    log = procs.spawn("fifo_log_from_actor", Log)
    driver = procs.slice(gpus=0).spawn("driver", Driver)
    n = 150
    logs = driver.drive.call_one(log, n).get(timeout=REPLY_TIMEOUT)
    expected = [[i for i in range(n) if i % 3 != 1 or i % 2 == rank] for rank in (0, 1)]
    assert logs == expected
    driver.stop().get(timeout=REPLY_TIMEOUT)
    log.stop().get(timeout=REPLY_TIMEOUT)


# -- argument binding on the caller -----------------------------------------------------


BAD_CALLS = [
    pytest.param((), {}, id="missing-argument"),
    pytest.param((1, 2, 3), {}, id="too-many-positional"),
    pytest.param((1,), {"d": 4}, id="unknown-keyword"),
    pytest.param((1, 2), {"b": 2}, id="duplicate-argument"),
    pytest.param((1, 2, 3), {"c": 1}, id="keyword-only-given-positionally"),
]


@pytest.mark.parametrize("args,kwargs", BAD_CALLS)
@pytest.mark.parametrize("adverb", ["call", "call_one", "choose", "stream", "broadcast"])
def test_arguments_that_do_not_fit_the_signature_raise_type_error_and_send_nothing(
    strict, adverb: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    mesh = strict.slice(gpus=0) if adverb == "call_one" else strict
    with pytest.raises(TypeError):
        getattr(mesh.take, adverb)(*args, **kwargs)
    assert list(strict.count.call().get(timeout=REPLY_TIMEOUT).values()) == [0, 0]


def test_arguments_that_fit_the_signature_are_delivered(strict) -> None:
    assert strict.slice(gpus=0).take.call_one(1, 2, c=3).get(timeout=REPLY_TIMEOUT) == 6
    assert strict.slice(gpus=0).take.call_one(a=1).get(timeout=REPLY_TIMEOUT) == 1


@pytest.mark.parametrize("adverb", ["call", "call_one", "choose", "stream", "broadcast"])
def test_unpicklable_keyword_argument_raises_type_error_naming_it_and_sends_nothing(
    strict, adverb: str
) -> None:
    mesh = strict.slice(gpus=1) if adverb == "call_one" else strict
    with pytest.raises(TypeError, match="payload"):
        getattr(mesh.store, adverb)(payload=threading.Lock())
    assert list(strict.count.call().get(timeout=REPLY_TIMEOUT).values()) == [0, 0]


def test_unpicklable_positional_argument_raises_type_error_and_sends_nothing(strict) -> None:
    with socket.socket() as sock, pytest.raises(TypeError):
        strict.store.call(sock)
    with pytest.raises(TypeError):
        strict.store.broadcast({"nested": [threading.Lock()]})
    assert list(strict.count.call().get(timeout=REPLY_TIMEOUT).values()) == [0, 0]


def test_unpicklable_positional_argument_error_names_the_parameter(strict) -> None:
    with pytest.raises(TypeError) as info:
        strict.store.call(threading.Lock())
    assert "payload" in str(info.value)
    assert "store" in str(info.value)


def test_current_rank_inside_a_recorder_matches_value_mesh_position(procs: ProcMesh) -> None:
    class RankEcho(Actor):
        @endpoint
        def rank(self) -> int:
            return current_rank().rank

    mesh = procs.spawn("rank_echo_local", RankEcho)
    values = mesh.rank.call().get(timeout=REPLY_TIMEOUT)
    assert [(p.rank, v) for p, v in values.items()] == [(0, 0), (1, 1)]
    mesh.stop().get(timeout=REPLY_TIMEOUT)
