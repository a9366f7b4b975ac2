"""``ActorMesh``: a mesh of actors of one class, sliceable, picklable, messaged by endpoint."""

from __future__ import annotations

import concurrent.futures
import dataclasses
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ..._mesh import MeshTrait, Shape
from ..._runtime.node import Node, bound
from ..core import owned
from ..core.collect import Countdown, set_future, wait_ready
from ..core.endpoints import EndpointProperty, endpoints_of
from ..core.future import Future
from ..core.meshref import MeshRef, MeshState
from .adverbs import Endpoint, NotAnEndpoint
from .envelope import stopped
from .route import DirectRoute, Route, TreeRoute

if TYPE_CHECKING:
    pass

_State = MeshState  # the name the API's other modules and supervision import

__all__ = ["ActorMesh", "MeshRef"]

A = TypeVar("A")


class ActorMesh(MeshTrait, Generic[A]):
    """A mesh of actors. Its endpoints are attributes: ``mesh.method.call(...)``.

    Returned by ``ProcMesh.spawn`` without blocking; ``initialized`` completes
    when every actor's ``__init__`` has run. Slicing (``mesh.slice(gpus=0)``)
    gives a mesh of some of the same actors. Meshes can be passed to other
    actors as arguments.
    """

    def __init__(
        self,
        ref: MeshRef,
        shape: Shape,
        state: _State | None = None,
        proc_mesh: object = None,  # the ProcMesh it was spawned on (procs imports this module)
    ) -> None:
        self._ref = ref
        self.__shape = shape
        self._state = state if state is not None else _State()
        self._proc_mesh = proc_mesh
        self._endpoints: dict[str, EndpointProperty] = endpoints_of(ref.cls)

    @property
    def _shape(self) -> Shape:
        return self.__shape

    def _labels_sizes(self) -> tuple[tuple[str, ...], tuple[int, ...]]:
        """This mesh's dimension names and sizes (what each message's rank is relative to)."""
        cached = self.__dict__.get("_ls")
        if cached is None:
            ext = self.__shape.extent
            cached = self.__dict__["_ls"] = (tuple(ext.labels), tuple(ext.sizes))
        return cached

    def _new_with_shape(self, shape: Shape) -> ActorMesh[A]:
        return ActorMesh(self._ref, shape, self._state, self._proc_mesh)

    @property
    def _route(self) -> Route:
        """How this mesh's messages travel: made on first use, then kept (slices share
        the decision between direct and tree)."""
        route: Route | None = self.__dict__.get("_route_")
        if route is None:
            route = self.__dict__["_route_"] = self._make_route(fixed=True)
        return route

    def _node(self) -> Node:
        """The node this mesh belongs to: the one it was spawned from, or, for a mesh
        unpickled in this process, this process's (looked up once, then kept)."""
        return bound(self._state)

    def _make_route(self, *, fixed: bool, tree: bool | None = None) -> Route:
        state = self._state
        rt = self._node().runtime
        if tree is None:
            tree = state.tree
            if tree is None:  # the runtime keeps the decision for every copy of the mesh
                tree = state.tree = rt.tree.use_tree(self._ref.mesh_id, self._ref.procs)
        cls = TreeRoute if tree else DirectRoute
        return cls(rt, self._ref, self._shape, state, fixed, self)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_ref", "_state", "_endpoints", "_proc_mesh"):
            raise AttributeError(name)
        prop = self._endpoints.get(name)
        if prop is not None:
            ep: Endpoint[Any, Any] = Endpoint(self._route, name, prop)
            object.__setattr__(self, name, ep)
            return ep
        if callable(getattr(self._ref.cls, name, None)):
            return NotAnEndpoint(self._route, name)
        raise AttributeError(
            f"actor mesh {self._ref.name!r} of {self._ref.cls.__qualname__} has no endpoint "
            f"{name!r}; its endpoints are {sorted(self._endpoints)}"
        )

    @property
    def name(self) -> str:
        return self._ref.name

    @property
    def proc_mesh(self) -> Any:
        return self._proc_mesh

    @property
    def initialized(self) -> Future[None]:
        """Completes when every actor's ``__init__`` has run; raises if one failed."""
        cf = self._state.initialized
        if cf is None:
            return Future._resolved(None, f"{self._ref.name}.initialized")
        return Future._create(cf, f"the initialisation of actor mesh {self._ref.name!r}")

    def _check_usable(self) -> None:
        if self._state.stopped:
            raise stopped(self._ref)

    def stop(self, reason: str = "stopped by client") -> Future[None]:
        """Stop these actors: each finishes what it is doing, runs ``__cleanup__``, and goes.

        Does not block; the future completes when all have stopped (a dead proc
        counts as stopped). Later calls raise ``SupervisionError``.
        """
        ranks = self._shape.ranks()
        cf: concurrent.futures.Future[Any] = concurrent.futures.Future()
        if self._state.stopped or not ranks:
            cf.set_result(None)
            return Future._create(cf, f"stopping {self._ref.name!r}")
        route = self._route
        whole = len(ranks) == len(self._ref.procs)
        if whole:
            self._state.stopped = True
        mesh_id = self._ref.mesh_id
        node = self._node()

        def done() -> None:
            if whole:  # its owner holds it no more (nothing it does can fail now)
                owned.forget(node, mesh_id)
            set_future(cf, True, None)

        countdown = Countdown(len(ranks), done)
        route.stop(ranks, reason, countdown.tick, f"{self._ref.name}.stop()")
        return Future._create(cf, f"stopping actor mesh {self._ref.name!r}")

    async def __aenter__(self) -> ActorMesh[A]:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()

    def __reduce__(self) -> Any:
        wait_ready(self._node().runtime, self._ref.procs)
        rt = self._route.rt
        ref = dataclasses.replace(
            self._ref, procs=tuple(rt.peers.resolve(p) for p in self._ref.procs)
        )
        return (_rebuild, (ref, self._shape))

    def __repr__(self) -> str:
        return f"<ActorMesh {self._ref.name!r} of {self._ref.cls.__qualname__} {self.sizes}>"


def _rebuild(ref: MeshRef, shape: Shape) -> ActorMesh[Any]:
    return ActorMesh(ref, shape)
