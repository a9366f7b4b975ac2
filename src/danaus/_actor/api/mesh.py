"""``ActorMesh``: a mesh of actors of one class, sliceable, picklable, messaged by endpoint."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ... import _config as config
from ..._errors import SupervisionError
from ..._mesh import Extent, MeshTrait, Point, Shape
from ..._mesh.tree import Selection
from ..._runtime.hosting import host
from ..._runtime.messaging.tree import FLAG_STOP
from ..._wire.ids import ActorId, ProcId
from ..._wire.protocol import Cast, StopActor
from ..core import owned
from ..core.collect import Collector, Countdown, TreeCollector, set_future, wait_ready
from ..core.context import display_name
from ..core.endpoints import EndpointProperty, endpoints_of
from ..core.future import Future
from .adverbs import Endpoint, NotAnEndpoint

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..._runtime.messaging.runtime import Runtime
    from .procs import ProcMesh

__all__ = ["ActorMesh", "MeshRef"]

A = TypeVar("A")


@dataclass(frozen=True)
class MeshRef:
    """What identifies an actor mesh anywhere: it travels when the mesh is pickled."""

    mesh_id: str
    name: str
    cls: type
    procs: tuple[ProcId, ...]  # by rank in the whole mesh
    owner: ActorId | None


@dataclass
class _State:
    """Client-side state shared by a mesh and its slices (not pickled)."""

    initialized: concurrent.futures.Future[Any] | None = None
    stopped: bool = False
    failed: dict[int, str] = field(default_factory=dict)  # rank -> why (owner's view)
    tracebacks: dict[int, str] = field(default_factory=dict)  # rank -> remote traceback
    lock: threading.Lock = field(default_factory=threading.Lock)
    booted: bool = False  # every proc of the mesh has booted (checked before a tree cast)


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
        proc_mesh: ProcMesh | None = None,
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

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_ref", "_state", "_endpoints", "_proc_mesh"):
            raise AttributeError(name)
        prop = self._endpoints.get(name)
        if prop is not None:
            ep: Endpoint[Any, Any] = Endpoint(self, name, prop)
            object.__setattr__(self, name, ep)
            return ep
        if callable(getattr(self._ref.cls, name, None)):
            return NotAnEndpoint(self, name)
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
            ref = self._ref
            owner = ref.owner
            root = owner is None or owner.mesh == "root"
            creator = "<root>" if root else f"<{owner.mesh}[{owner.rank}]>"  # type: ignore[union-attr]
            cls = ref.cls
            nowhere = Point(0, Extent([], []))
            who = display_name(creator, cls.__module__, cls.__qualname__, ref.name, nowhere)
            raise SupervisionError(  # Monarch's sentence first: programs match on it
                f"The actor {who} and all its descendants have failed:\n"
                f"  actor mesh {ref.name!r} was stopped; spawn a new one to keep working",
                actor=self._ref.name,
                reason="stopped",
                during="call",
            )

    def _failed_reason(self, rank: int) -> str | None:
        """Why actor ``rank`` (of the whole mesh) is known to have failed, if it has."""
        return self._state.failed.get(rank) if self._state.failed else None

    def stop(self, reason: str = "stopped by client") -> Future[None]:
        """Stop these actors: each finishes what it is doing, runs ``__cleanup__``, and goes.

        Does not block; the future completes when all have stopped (a dead proc
        counts as stopped). Later calls raise ``SupervisionError``.
        """
        rt = host.ensure_runtime()
        ranks = self._shape.ranks()
        cf: concurrent.futures.Future[Any] = concurrent.futures.Future()
        if self._state.stopped or not ranks:
            cf.set_result(None)
            return Future._create(cf, f"stopping {self._ref.name!r}")
        whole = len(ranks) == len(self._ref.procs)
        if whole:
            self._state.stopped = True
        mesh_id = self._ref.mesh_id

        def stopped() -> None:
            if whole:  # its owner holds it no more (nothing it does can fail now)
                owned.forget(mesh_id)
            set_future(cf, True, None)

        countdown = Countdown(len(ranks), stopped)
        what = f"{self._ref.name}.stop()"
        if rt.tree.use_tree(self._ref.mesh_id, self._ref.procs):
            self._stop_through_tree(rt, ranks, reason, countdown.tick, what)
            return Future._create(cf, f"stopping actor mesh {self._ref.name!r}")
        collector = Collector(rt, what, len(ranks), countdown.tick, lost_is_ok=True)
        for index, rank in enumerate(ranks):
            collector.expect(index, self._ref.procs[rank])
        for index, rank in enumerate(ranks):
            proc = self._ref.procs[rank]
            rt.send(
                proc,
                StopActor(self._ref.mesh_id, rank, collector.port, index, reason),
                on_fail=functools.partial(collector.fail, index),
            )
        return Future._create(cf, f"stopping actor mesh {self._ref.name!r}")

    def _stop_through_tree(
        self, rt: Runtime, ranks: list[int], reason: str, tick: Callable[..., None], what: str
    ) -> None:
        """Stop a mesh messaged through its cast tree: the stop follows, on every path,
        whatever this proc sent to it before (a broadcast is handled, then the stop)."""
        fanout = config.get("tree_fanout")
        collector = TreeCollector(
            rt,
            what,
            len(ranks),
            tick,
            mesh_size=len(self._ref.procs),
            fanout=fanout,
            lost_is_ok=True,
        )
        targets = [(i, r, self._ref.procs[r]) for i, r in enumerate(ranks)]
        for index, _, proc in targets:
            collector.expect(index, proc)
        collector.expect_tree(targets, self._ref.procs, ancestors=len(ranks) < len(self._ref.procs))
        selection = Selection.of(self._shape.ndslice)
        labels = tuple(self._shape.extent.labels)
        sizes = tuple(self._shape.extent.sizes)
        header = Cast(
            self._ref.mesh_id, self._ref.name, reason, collector.port, False,
            selection.to_wire(), 0, len(self._ref.procs), fanout, None, labels, sizes,
            None, (), FLAG_STOP, 0,
        )  # fmt: skip
        rt.tree.cast(
            self._ref.procs,
            selection,
            header,
            b"",
            (),
            on_fail=lambda s, r, why: collector.fail(s, why),
        )

    async def __aenter__(self) -> ActorMesh[A]:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()

    def __reduce__(self) -> Any:
        wait_ready(self._ref.procs)
        rt = host.ensure_runtime()
        ref = dataclasses.replace(self._ref, procs=tuple(rt.resolve(p) for p in self._ref.procs))
        return (_rebuild, (ref, self._shape))

    def __repr__(self) -> str:
        return f"<ActorMesh {self._ref.name!r} of {self._ref.cls.__qualname__} {self.sizes}>"


def _rebuild(ref: MeshRef, shape: Shape) -> ActorMesh[Any]:
    return ActorMesh(ref, shape)
