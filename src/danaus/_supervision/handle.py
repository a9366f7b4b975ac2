"""The handle of a supervised mesh (``SupervisedMesh``), valid across restarts, and
its endpoints, which hold a call while a rank it targets restarts."""

from __future__ import annotations

import concurrent.futures
import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from .._actor.api.adverbs import Endpoint
from .._actor.api.mesh import ActorMesh, MeshRef
from .._actor.api.route import DirectRoute, Route
from .._actor.core import owned
from .._actor.core.collect import set_future
from .._actor.core.context import acting_as, context
from .._actor.core.future import Future
from .._mesh import Shape
from .._runtime.logs.dirs import NOTIFY
from .child import _MeshChild, stop_ranks

log = logging.getLogger("danaus.supervision")

A = TypeVar("A")


class _ChildRef:
    """The ``MeshRef`` attribute of a supervised mesh or its route: the child's current
    ref (a restart replaces it); what the base class's ``__init__`` assigns is ignored."""

    def __get__(self, obj: Any, objtype: Any = None) -> MeshRef:
        ref: MeshRef = obj._child.ref
        return ref

    def __set__(self, obj: Any, value: MeshRef) -> None:
        pass  # the child's ref is the one


class SupervisedMesh(ActorMesh[A]):
    """The ``ActorMesh`` of a supervised child: valid across restarts.

    It reads the child's current procs, holds calls to ranks being restarted
    until their new actors are spawned, and is always messaged directly (not
    through a cast tree, whose routes are fixed per mesh).
    """

    def __init__(self, child: _MeshChild, shape: Shape) -> None:
        self._child = child
        super().__init__(child.ref, shape, child.state, None)

    _ref = _ChildRef()

    def _new_with_shape(self, shape: Shape) -> SupervisedMesh[A]:
        return SupervisedMesh(self._child, shape)

    @property
    def _route(self) -> Route:
        """Always direct, its targets read anew each time (a restart may move a rank)."""
        route: Route | None = self.__dict__.get("_route_")
        if route is None:
            route = self.__dict__["_route_"] = _SupervisedRoute(self._child, self._shape, self)
        return route

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_child", "_state", "_endpoints", "_proc_mesh"):
            raise AttributeError(name)
        prop = self._endpoints.get(name)
        if prop is not None:
            ep = _SupervisedEndpoint(self._route, name, prop)
            ep._child = self._child
            ep._ranks = frozenset(self._shape.ranks())
            object.__setattr__(self, name, ep)
            return ep
        return super().__getattr__(name)

    @property
    def initialized(self) -> Future[None]:
        """Completes when every rank has an actor whose ``__init__`` ran (after restarts,
        if a first one failed); raises ``SupervisionError`` if the supervisor gave up."""
        return Future._create(self._child.ready, f"{self.name} ready")

    def stop(self, reason: str = "stopped by client") -> Future[None]:
        """Stop these actors; the supervisor restarts them no more (a whole mesh)."""
        child = self._child
        ranks = self._shape.ranks()
        whole = len(ranks) == child.size
        cf: concurrent.futures.Future[Any] = concurrent.futures.Future()
        if child.state.stopped or not ranks:
            cf.set_result(None)
            return Future._create(cf, f"stopping {self.name!r}")
        if whole:
            child.retire()
        done = stop_ranks(child.node, child.ref, ranks, reason)

        def finished(_: Any) -> None:
            if whole:
                owned.forget(child.node, child.ref.mesh_id)
            set_future(cf, True, None)

        done.add_done_callback(finished)
        return Future._create(cf, f"stopping actor mesh {self.name!r}")

    def __repr__(self) -> str:
        return f"<ActorMesh {self.name!r} of {self._ref.cls.__qualname__} {self.sizes} supervised>"


class _SupervisedRoute(DirectRoute):
    """A supervised mesh's route: direct (a cast tree's routes are fixed per mesh), to
    the child's current procs (a restart may move a rank)."""

    def __init__(self, child: _MeshChild, shape: Shape, mesh: SupervisedMesh[Any]) -> None:
        self._child = child
        rt = child.node.runtime
        super().__init__(rt, child.ref, shape, child.state, fixed=False, mesh=mesh)

    ref = _ChildRef()


class _SupervisedEndpoint(Endpoint[Any, Any]):
    """An endpoint of a supervised mesh: holds its call while a rank it targets restarts."""

    _child: _MeshChild
    _ranks: frozenset[int]  # the ranks of the whole mesh it targets

    def _deferred(
        self, method: Callable[..., Any], args: Any, kwargs: Any, n: int, check: Any = None
    ) -> Any:
        """None: send now. Else hold ``method(*args, **kwargs)`` until the ranks it targets
        are restarted; ``n`` futures stand in for the ones it returns."""
        child = self._child
        if not child.held:  # the common case: one attribute read
            return None
        self._prop.bind(*(check or (args, kwargs)))  # a wrong call raises here, not later
        cfs: list[concurrent.futures.Future[Any]] = [concurrent.futures.Future() for _ in range(n)]

        def run() -> None:
            try:
                got = method(*args, **kwargs)
            except BaseException as e:
                for cf in cfs:
                    set_future(cf, False, e)
                if not cfs:
                    log.warning(
                        "a held %s could not be sent: %r", self._what, e, extra={NOTIFY: True}
                    )
                return
            futs = [got] if n == 1 else (list(got) if n else [])
            for inner, cf in zip(futs, cfs, strict=True):
                inner._cf.add_done_callback(functools.partial(_copy, cf))

        ctx = context()

        def later() -> None:
            with acting_as(ctx):
                run()

        if not child.hold(self._ranks, later):
            return None
        return [Future._create(cf, self._what) for cf in cfs]

    def call(self, *args: Any, **kwargs: Any) -> Future[Any]:
        held = self._deferred(super().call, args, kwargs, 1)
        return held[0] if held is not None else super().call(*args, **kwargs)

    def call_one(self, *args: Any, **kwargs: Any) -> Future[Any]:
        held = self._deferred(super().call_one, args, kwargs, 1)
        return held[0] if held is not None else super().call_one(*args, **kwargs)

    def choose(self, *args: Any, **kwargs: Any) -> Future[Any]:
        held = self._deferred(super().choose, args, kwargs, 1)
        return held[0] if held is not None else super().choose(*args, **kwargs)

    def stream(self, *args: Any, **kwargs: Any) -> Any:
        n = len(self._ranks)
        held = self._deferred(super().stream, args, kwargs, n)
        return iter(held) if held is not None else super().stream(*args, **kwargs)

    def broadcast(self, *args: Any, **kwargs: Any) -> None:
        if self._deferred(super().broadcast, args, kwargs, 0) is None:
            super().broadcast(*args, **kwargs)

    def _send_to_port(self, args: Any, kwargs: Any, port: Any, selection: str) -> None:
        method = super()._send_to_port
        send = lambda: method(args, kwargs, port, selection)  # noqa: E731
        if self._deferred(send, (), {}, 0, (args, kwargs)) is None:
            method(args, kwargs, port, selection)


def _copy(cf: concurrent.futures.Future[Any], inner: Any) -> None:
    exc = inner.exception()
    set_future(cf, exc is None, inner.result() if exc is None else exc)
