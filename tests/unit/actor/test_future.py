"""A Future made from a coroutine, and ``Pending``, the light result slot of ``call_one``:
in this process, no reply involved. Futures of calls to actors on procs:
``tests/integration/test_future.py`` and ``tests/integration/test_send_path.py``."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any

import pytest

from danaus._actor.core.future import Pending
from danaus.actor import Future

# Bounded wait for what another thread of this test completes (an event, never a delay).
TIMEOUT = 30.0


# -- Future(coro=...) ---------------------------------------------------------------


def test_future_cannot_be_constructed_from_anything_but_a_coroutine() -> None:
    with pytest.raises(TypeError, match="Future\\(coro="):
        Future()
    with pytest.raises(TypeError, match="lambda"):
        Future(lambda: 1)
    with pytest.raises(TypeError, match=r"needs a coroutine.*42"):
        Future(coro=42)


def test_future_from_a_coroutine_can_be_awaited_and_raises_what_it_raises() -> None:
    async def fails() -> None:
        raise KeyError("inside")

    async def main() -> int:
        async def seven() -> int:
            await asyncio.sleep(0)
            return 7

        value = await Future(coro=seven())
        with pytest.raises(KeyError, match="inside"):
            await Future(coro=fails())
        return value

    assert asyncio.run(main()) == 7
    with pytest.raises(KeyError, match="inside"):
        Future(coro=fails()).get(timeout=TIMEOUT)


# -- Pending: the light future of call_one ---------------------------------------


def test_pending_completes_once_and_wakes_every_waiter() -> None:
    p = Pending()
    got: list[Any] = []
    threads = [threading.Thread(target=lambda: got.append(p.result(TIMEOUT))) for _ in range(3)]
    for t in threads:
        t.start()
    calls: list[Any] = []
    p.add_done_callback(calls.append)
    p.set_result(5)
    for t in threads:
        t.join(TIMEOUT)
    assert got == [5, 5, 5] and calls == [p] and p.done() and p.exception() is None
    with pytest.raises(concurrent.futures.InvalidStateError):
        p.set_result(6)
    late: list[Any] = []
    p.add_done_callback(late.append)  # already done: runs at once
    assert late == [p] and p.result() == 5


def test_pending_raises_its_exception_and_times_out_while_pending() -> None:
    p = Pending()
    with pytest.raises(TimeoutError):
        p.result(0.01)
    assert not p.done()
    err = ValueError("x")
    p.set_exception(err)
    assert p.exception() is err
    with pytest.raises(ValueError, match="x"):
        p.result(0)
