"""What a type checker sees of endpoints: checked by mypy in ``test_mypy.py``, never run.

Each ``assert_type`` states the type mypy must infer; a call that must be
flagged carries ``# type: ignore[<code>]``, which ``warn_unused_ignores``
turns into an error of its own when mypy stops flagging it. So this file
passes mypy only while endpoints stay typed as ``Endpoint[P, R]``.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator

from typing_extensions import assert_type

from danaus.actor import (
    Accumulator,
    Actor,
    Endpoint,
    Future,
    Port,
    ProcMesh,
    ValueMesh,
    as_endpoint,
    concurrent_endpoint,
    endpoint,
    get_or_spawn_controller,
    send,
)
from danaus.supervisor import Supervisor


class Counter(Actor):
    def __init__(self, start: int) -> None:
        self.n = start

    @endpoint
    def incr(self, by: int = 1) -> int:
        self.n += by
        return self.n

    @endpoint
    def square(self, x: int, /) -> int:
        return x * x

    @endpoint
    async def label(self, prefix: str, *, upper: bool = False) -> str:
        return prefix.upper() if upper else prefix

    @endpoint(explicit_response_port=True)
    def later(self, port: Port[float], x: int) -> None:
        port.send(x / 2)

    @endpoint(propagate="inspect")
    def with_options(self) -> bytes:
        return b""

    @concurrent_endpoint
    async def overlapping(self, n: int) -> list[int]:
        return list(range(n))

    @endpoint
    def uses_another_endpoint(self) -> int:
        # Inside the actor an endpoint is the bound method: calling it is allowed.
        self.incr(2)
        return self.n

    def helper(self, x: str) -> int:
        return len(x)


def adverbs(procs: ProcMesh) -> None:
    mesh = procs.spawn("counters", Counter, 0)
    assert_type(mesh, Counter)
    assert_type(mesh.square, Endpoint[[int], int])
    assert_type(mesh.incr.call_one(3), Future[int])
    assert_type(mesh.incr.call_one(3).get(), int)
    assert_type(mesh.incr.call(by=2), Future[ValueMesh[int]])
    assert_type(mesh.incr.choose(), Future[int])
    assert_type(mesh.incr.stream(), Iterator[Future[int]])
    assert_type(mesh.incr.broadcast(1), None)
    # An async endpoint's result is what it returns, not a coroutine.
    assert_type(mesh.label.call_one("a", upper=True), Future[str])
    # With an explicit response port: what the port carries.
    assert_type(mesh.later.call_one(4), Future[float])
    assert_type(mesh.with_options.call_one(), Future[bytes])
    assert_type(mesh.overlapping.call_one(3), Future[list[int]])
    # A slice of the mesh is a mesh of the same actors.
    assert_type(mesh.slice(gpus=0), Counter)
    assert_type(mesh.slice(gpus=0).incr.call_one(), Future[int])
    assert_type(mesh.initialized, Future[None])
    assert_type(mesh.stop(), Future[None])


def wrong_arguments(procs: ProcMesh) -> None:
    mesh = procs.spawn("counters", Counter, 0)
    mesh.incr.call_one("three")  # type: ignore[arg-type]
    mesh.incr.call(1, 2)  # type: ignore[call-arg]
    mesh.label.choose(prefix="p", lower=True)  # type: ignore[call-arg]
    mesh.later.broadcast(port=None, x=1)  # type: ignore[call-arg]
    mesh.incr.call_one().get().upper()  # type: ignore[attr-defined]
    mesh.not_an_endpoint.call_one()  # type: ignore[attr-defined]


def helpers(procs: ProcMesh) -> None:
    mesh = procs.spawn("counters", Counter, 0)
    total = Accumulator(mesh.incr, 0, operator.add)
    assert_type(total.accumulate(1), Future[int])
    assert_type(as_endpoint(mesh.helper).call_one("abc"), Future[int])
    send(mesh.incr, (1,), {})
    assert_type(get_or_spawn_controller("counter", Counter, 0), Future[Counter])


async def awaiting(mesh: Counter) -> None:
    assert_type(await mesh.incr.call_one(), int)
    assert_type(await mesh.label.call("x"), ValueMesh[str])
    for fut in mesh.incr.stream(2):
        assert_type(await fut, int)


def supervised(procs: ProcMesh) -> None:
    workers = Supervisor(strategy="one_for_all").spawn(procs, "workers", Counter, 0)
    assert_type(workers, Counter)
    assert_type(workers.incr.call_one(1), Future[int])
