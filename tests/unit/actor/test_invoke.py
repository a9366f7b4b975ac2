"""The invoke step: an Invocation runs an endpoint's body and yields an Outcome."""

from __future__ import annotations

import asyncio
from typing import Any

from danaus._actor.core.context import Instance
from danaus._actor.core.endpoints import EndpointProperty, EndpointTable
from danaus._actor.core.invoke import Contexts, Invocation, Outcome, invoke, invoke_async
from danaus._mesh import Extent, Point

from .conftest import ME

INSTANCE = Instance(ME, "counter", Point(0, Extent(["gpus"], [1])), "Counter", None)


class Counter:
    def __init__(self) -> None:
        self.n = 0

    def incr(self, by: int, *, twice: bool = False) -> int:
        self.n += by * (2 if twice else 1)
        return self.n

    def boom(self) -> None:
        raise ValueError("boom")

    async def later(self, x: int) -> int:
        await asyncio.sleep(0)
        return x + 1

    def coro(self, x: int) -> Any:
        return self.later(x)


def call(fn: Any, *args: Any, **kwargs: Any) -> Invocation:
    return Invocation(EndpointProperty(fn), None, 0, args, kwargs, None, None, None)


def test_a_body_that_returns_gives_its_value() -> None:
    c = Counter()
    out = invoke(c, call(Counter.incr, 2, twice=True))
    assert out == Outcome(4, None, out.t0) and out.ok and out.t0 > 0
    assert c.n == 4


def test_a_body_that_raises_gives_its_exception_with_the_users_frame() -> None:
    out = invoke(Counter(), call(Counter.boom))
    assert not out.ok and out.value is None
    assert isinstance(out.error, ValueError) and str(out.error) == "boom"
    tb = out.error.__traceback__
    frames = []
    while tb is not None:
        frames.append(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    assert frames[-1] == "boom"


def test_a_sync_actors_body_that_returns_a_coroutine_is_run_to_its_end() -> None:
    assert invoke(Counter(), call(Counter.coro, 1)).value == 2


def test_an_async_body_is_awaited() -> None:
    c = Counter()
    out = asyncio.run(invoke_async(c, call(Counter.later, 41)))
    assert out.value == 42 and out.error is None
    out = asyncio.run(invoke_async(c, call(Counter.boom)))
    assert isinstance(out.error, ValueError)


def test_an_async_body_cancelled_gives_the_cancellation() -> None:
    async def main() -> Outcome:
        async def forever(self: Any) -> None:
            await asyncio.Event().wait()

        task = asyncio.ensure_future(invoke_async(None, call(forever)))
        await asyncio.sleep(0)
        task.cancel()
        return await task

    out = asyncio.run(main())
    assert isinstance(out.error, asyncio.CancelledError)


def test_contexts_are_built_once_per_rank_extent_and_chain() -> None:
    contexts = Contexts()
    contexts.instance = INSTANCE
    ctx = contexts[3, ("gpus",), (4,), ()]
    assert ctx.actor_instance is INSTANCE and ctx.message_rank == Point(3, Extent(["gpus"], [4]))
    assert contexts[3, ("gpus",), (4,), ()] is ctx
    assert contexts[2, ("gpus",), (4,), ()] is not ctx
    chained = contexts[3, ("gpus",), (4,), (ME,)]
    assert chained is not ctx and chained._chain == (ME,)
    for i in range(300):  # bounded: it starts again when full
        contexts[i, ("gpus",), (300,), ()]
    assert len(contexts) <= 256


def test_the_endpoint_table_finds_endpoints_and_makes_adhoc_ones() -> None:
    class A:
        @EndpointProperty
        def e(self) -> int:
            return 1

        def plain(self) -> int:
            return 2

        value = 3

    table = EndpointTable(A)
    assert set(table) == {"e"} and table.get("plain") is None
    adhoc = table.adhoc("plain", explicit=False)
    assert adhoc is not None and adhoc.name == "plain" and not adhoc.explicit_response_port
    assert table.adhoc("plain", explicit=False) is adhoc  # made once
    explicit = table.adhoc("plain", explicit=True)
    assert explicit is not None and explicit.explicit_response_port
    assert table.adhoc("value", explicit=False) is None  # not callable
    assert table.adhoc("missing", explicit=False) is None
    assert EndpointTable() == {}
