"""Future of calls to actors on procs: blocking get with timeouts, asyncio interop,
result/exception. A Future made from a coroutine alone: ``tests/unit/actor/test_future.py``."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator

import pytest

from danaus.actor import Actor, ActorError, ActorMesh, Future, ProcMesh, endpoint

from .conftest import REPLY_TIMEOUT, LatchPair


class Echo(Actor):
    @endpoint
    def echo(self, x: object) -> object:
        return x

    @endpoint
    def fail(self, message: str) -> None:
        raise KeyError(message)


@pytest.fixture(scope="module")
def echo(procs: ProcMesh) -> Iterator[ActorMesh[Echo]]:
    mesh = procs.spawn("echo", Echo)
    yield mesh
    mesh.stop().get(timeout=REPLY_TIMEOUT)


def _held(latch: LatchPair) -> tuple[Future[bool], str]:
    """A call that stays pending until ``latch.release(key, gpus=0)``."""
    key = latch.key()
    return latch.waiters.slice(gpus=0).wait.call_one(key), key


def test_get_blocks_until_the_reply_arrives(echo) -> None:
    assert echo.slice(gpus=0).echo.call_one("hi").get() == "hi"


def test_get_timeout_raises_timeout_error_and_the_future_stays_usable(latch: LatchPair) -> None:
    fut, key = _held(latch)
    with pytest.raises(TimeoutError):
        fut.get(timeout=0.05)
    assert not fut.done()
    with pytest.raises(TimeoutError):
        fut.get(timeout=0)
    latch.release(key, gpus=0)
    assert fut.get(timeout=REPLY_TIMEOUT) is True
    assert fut.done()
    assert fut.get(timeout=0) is True


def test_timeout_error_names_what_was_awaited(latch: LatchPair) -> None:
    fut, key = _held(latch)
    with pytest.raises(TimeoutError) as info:
        fut.get(timeout=0.01)
    latch.release(key, gpus=0)
    fut.get(timeout=REPLY_TIMEOUT)
    assert "wait" in str(info.value)
    assert "0.01" in str(info.value)


@pytest.mark.parametrize("bad", [-1, -0.5, math.inf, math.nan])
def test_get_rejects_a_negative_or_non_finite_timeout(echo, bad: float) -> None:
    fut = echo.slice(gpus=0).echo.call_one(1)
    with pytest.raises(ValueError):
        fut.get(timeout=bad)
    assert fut.get(timeout=REPLY_TIMEOUT) == 1


def test_future_from_a_coroutine_runs_it_once_when_first_waited_for(echo) -> None:
    runs: list[int] = []

    async def both() -> int:
        runs.append(1)
        a = await echo.slice(gpus=0).echo.call_one(20)
        b = await echo.slice(gpus=1).echo.call_one(22)
        return a + b

    fut: Future[int] = Future(coro=both())
    assert runs == [] and not fut.done()  # lazy, as Monarch's
    assert fut.get(timeout=REPLY_TIMEOUT) == 42
    assert fut.get(timeout=REPLY_TIMEOUT) == 42
    assert runs == [1]


def test_await_future_inside_asyncio_run(echo) -> None:
    async def main() -> tuple[object, list[object]]:
        one = await echo.slice(gpus=1).echo.call_one("awaited")
        mesh = await echo.echo.call(5)
        return one, list(mesh.values())

    assert asyncio.run(main()) == ("awaited", [5, 5])


def test_a_future_is_a_coroutine_for_asyncio_run_and_create_task(echo) -> None:
    # Monarch declares logging_option and sync_workspace `async def`; its programs pass
    # them to asyncio.run, which takes coroutines only. Every danaus Future is one.
    import collections.abc

    fut = echo.slice(gpus=1).echo.call_one("driven")
    assert isinstance(fut, collections.abc.Coroutine)
    assert asyncio.run(fut) == "driven"
    assert fut.get(timeout=0) == "driven"  # still a future: its value stays
    assert asyncio.run(echo.slice(gpus=0).echo.call_one(7)) == 7  # pending when run

    async def main() -> list[object]:
        task = asyncio.create_task(echo.slice(gpus=0).echo.call_one("task"))
        both = await asyncio.gather(echo.slice(gpus=1).echo.call_one(1), task)
        return list(both)

    assert asyncio.run(main()) == [1, "task"]
    with pytest.raises(ActorError) as info:
        asyncio.run(echo.slice(gpus=0).fail.call_one("run-boom"))
    assert isinstance(info.value.exception, KeyError)


def test_a_future_driven_as_a_coroutine_can_be_cancelled_and_stays_usable(
    latch: LatchPair,
) -> None:
    fut, key = _held(latch)

    async def main() -> None:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.ensure_future(fut), 0.05)  # cancels its task

    asyncio.run(main())
    assert not fut.done()
    latch.release(key, gpus=0)
    assert asyncio.run(fut) is True  # driven afresh after the cancelled run
    assert fut.get(timeout=REPLY_TIMEOUT) is True


def test_logging_option_can_be_run_as_monarchs_coroutine(procs: ProcMesh) -> None:
    # Monarch's getting-started: asyncio.run(procs.logging_option(...)).
    assert asyncio.run(procs.logging_option(stream_to_client=True, aggregate_window_sec=3)) is None
    procs.logging_option()  # Monarch's defaults again


def test_await_on_a_future_that_raises_raises_actor_error(echo) -> None:
    async def main() -> None:
        await echo.slice(gpus=0).fail.call_one("async-boom")

    with pytest.raises(ActorError) as info:
        asyncio.run(main())
    assert isinstance(info.value.exception, KeyError)


def test_await_after_a_get_timeout_still_returns_the_value(latch: LatchPair) -> None:
    fut, key = _held(latch)
    with pytest.raises(TimeoutError):
        fut.get(timeout=0.01)

    async def main() -> bool:
        release = asyncio.create_task(asyncio.to_thread(latch.release, key, gpus=0))
        value = await fut
        await release
        return value

    assert asyncio.run(main()) is True


def test_as_asyncio_gives_an_asyncio_future_and_cancelling_it_does_not_poison(echo) -> None:
    fut = echo.slice(gpus=0).echo.call_one("shared")

    async def main() -> object:
        cancelled = fut.as_asyncio()
        assert isinstance(cancelled, asyncio.Future)
        cancelled.cancel()
        other = fut.as_asyncio()
        assert other is not cancelled
        return await other

    assert asyncio.run(main()) == "shared"
    assert fut.get(timeout=REPLY_TIMEOUT) == "shared"


def test_as_asyncio_works_on_two_event_loops(echo) -> None:
    fut = echo.slice(gpus=0).echo.call_one("twice")

    async def main() -> object:
        return await fut.as_asyncio()

    assert asyncio.run(main()) == "twice"
    assert asyncio.run(main()) == "twice"


def test_await_without_a_running_loop_raises_value_error(echo) -> None:
    fut = echo.slice(gpus=0).echo.call_one(0)

    async def main() -> object:
        return await fut

    coro = main()
    # Drive the coroutine by hand: no asyncio loop is running.
    with pytest.raises(ValueError):
        coro.send(None)
    coro.close()
    assert fut.get(timeout=REPLY_TIMEOUT) == 0


def test_get_inside_a_running_event_loop_warns(latch: LatchPair) -> None:
    fut, key = _held(latch)

    async def main() -> None:
        with pytest.warns(UserWarning, match="event loop"), pytest.raises(TimeoutError):
            fut.get(timeout=0.01)

    asyncio.run(main())
    latch.release(key, gpus=0)
    assert fut.get(timeout=REPLY_TIMEOUT) is True


def test_result_returns_the_value_and_exception_returns_none(echo) -> None:
    fut = echo.slice(gpus=0).echo.call_one([1, 2])
    assert fut.result(timeout=REPLY_TIMEOUT) == [1, 2]
    assert fut.exception(timeout=REPLY_TIMEOUT) is None


def test_exception_returns_the_actor_error_and_result_raises_it(echo) -> None:
    fut = echo.slice(gpus=1).fail.call_one("nope")
    exc = fut.exception(timeout=REPLY_TIMEOUT)
    assert isinstance(exc, ActorError)
    assert isinstance(exc.exception, KeyError)
    with pytest.raises(ActorError) as info:
        fut.result(timeout=REPLY_TIMEOUT)
    # Repeated retrievals give the same exception object.
    assert info.value is exc
    assert fut.exception() is exc


def test_exception_with_timeout_on_a_pending_future_raises_timeout_error(
    latch: LatchPair,
) -> None:
    fut, key = _held(latch)
    with pytest.raises(TimeoutError):
        fut.exception(timeout=0.01)
    latch.release(key, gpus=0)
    assert fut.exception(timeout=REPLY_TIMEOUT) is None


def test_repeated_get_returns_the_cached_value(echo) -> None:
    fut = echo.slice(gpus=0).echo.call_one({"k": 1})
    first = fut.get(timeout=REPLY_TIMEOUT)
    assert fut.get() is first
