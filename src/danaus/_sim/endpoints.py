"""The workers' endpoints as a simulated mesh hands them to the tensor layer
(``engine.targets(shape)``, ``engine.workers``): stand-ins that the engine answers at
once, since a simulated mesh has no worker actors to call."""

from __future__ import annotations

import concurrent.futures
from typing import Any, Protocol

from .._actor.core.future import Future
from .._mesh import Shape, Slice
from .._mesh.value_mesh import ValueMesh


class Answering(Protocol):
    """What the endpoints ask of the engine: a fetch, and a remote function's results."""

    def fetch(self, shape: Shape, ids: list[int]) -> list[Any]: ...

    def call_and_fetch(
        self, shape: Shape, fn: Any, args: Any, kwargs: Any, groups: bool
    ) -> list[Any]: ...


class Targets:
    """What ``engine.targets(shape)`` gives the tensor layer: the workers' endpoints."""

    def __init__(self, engine: Answering, shape: Shape) -> None:
        self.fetch = _FetchEndpoint(engine, shape)
        self.call_remote = _RemoteEndpoint(engine, shape)
        self._shape = shape


class Workers:
    """``engine.workers``: the tensor layer reads the workers' shape from it."""

    def __init__(self, shape: Shape) -> None:
        self._shape = shape


class _Reply:
    """A reply as the tensor layer reads it (``reply._cf``)."""

    def __init__(self, value: Any) -> None:
        self._cf: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._cf.set_result(value)


class _FetchEndpoint:
    def __init__(self, engine: Answering, shape: Shape) -> None:
        self.engine = engine
        self.shape = shape

    def call_one(self, ids: list[int]) -> _Reply:
        return _Reply(self.engine.fetch(self.shape, ids))


class _RemoteEndpoint:
    def __init__(self, engine: Answering, shape: Shape) -> None:
        self.engine = engine
        self.shape = shape

    def _run(self, fn: Any, args: Any, kwargs: Any, groups: bool) -> list[Any]:
        return self.engine.call_and_fetch(self.shape, fn, args, kwargs, groups)

    def call_one(self, fn: Any, args: Any, kwargs: Any, groups: bool) -> Future[Any]:
        values = self._run(fn, args, kwargs, groups)
        return Future._resolved(values[0], "a simulated remote function")

    def call(self, fn: Any, args: Any, kwargs: Any, groups: bool) -> Future[Any]:
        values = self._run(fn, args, kwargs, groups)
        ext = self.shape.extent
        vm = ValueMesh(Shape(list(ext.labels), Slice.new_row_major(list(ext.sizes))), values)
        return Future._resolved(vm, "a simulated remote function")

    def _send_to_port(self, a: Any, kw: Any, port: Any, selection: str) -> None:
        raise NotImplementedError(
            "send(remote_fn, ..., port=...) is not simulated: call the function with "
            "fn.call(...) or fn(...) on a simulated mesh"
        )
