"""Who is running now: ``context()``, the actor instance and the rank of the current message."""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Callable, Iterator
from typing import Any

from ..._mesh import Extent, Point
from ..._runtime.node import Node, this_node
from ..._wire.ids import ActorId, ProcId
from . import owned
from .failing import Aborted

# ``ProcMesh`` (``danaus._actor.api.procs``) is the actor API's, above this module: an
# actor's proc is typed ``Any`` here, the whole public ProcMesh handed to the user (a
# Protocol of a part of it would flag the rest of its methods in user code).
_ProcMesh = Any

__all__ = [
    "Context",
    "Instance",
    "context",
    "current_actor_name",
    "current_rank",
    "current_size",
    "display_name",
    "root_context",
    "sender",
]

_EMPTY = Extent([], [])


class Instance:
    """The running actor (or the client's root instance) as seen from inside it."""

    def __init__(
        self,
        actor_id: ActorId,
        name: str,
        rank: Point,
        class_name: str,
        creator: Instance | None,
        proc_mesh: _ProcMesh | None = None,
        class_module: str = "",
        node: Node | None = None,
    ) -> None:
        self.actor_id = actor_id
        self.name = name
        self.rank = rank
        self.class_name = class_name
        self.class_module = class_module
        self.creator = creator
        self._proc_mesh = proc_mesh
        self._cell: Any = None  # the ActorCell hosting it, inside procs
        # The node it runs on, given by whoever made it (its cell, or the node's root);
        # None for an instance unpickled here, which is not running in this process.
        self._node = node

    @property
    def proc_id(self) -> str:
        """This actor's proc as a string, ``name@address``, as Monarch's ``proc@location``
        (the proc itself is ``actor_id.proc``)."""
        return self.actor_id.proc_id

    @property
    def proc(self) -> _ProcMesh:
        """This actor's own proc, as a one-proc mesh you can spawn on."""
        make = self._home().part(ProcMeshOf).make
        if make is None:
            raise RuntimeError("the actor API is not installed on this node (danaus._bootstrap)")
        return make(self.actor_id.proc)

    def _home(self) -> Node:
        """The node it runs on; for an instance unpickled here (user code holding one,
        with no node of its own), this process's."""
        return self._node if self._node is not None else this_node()

    @property
    def proc_mesh(self) -> _ProcMesh:
        return self._proc_mesh if self._proc_mesh is not None else self.proc

    def __reduce__(self) -> Any:
        return (
            Instance,
            (self.actor_id, self.name, self.rank, self.class_name, self.creator, None)
            + ((self.class_module,) if self.class_module else ()),
        )

    def abort(self, reason: str | None = None) -> None:
        """Fail this actor now (call it from one of its endpoints); its owner is told.

        Raises a ``BaseException`` that unwinds the endpoint; do not catch it.
        """
        if self._cell is None:
            raise RuntimeError("abort() can only be called by an actor, from inside an endpoint")
        raise Aborted(reason)

    def kill(self, reason: str | None = None) -> None:
        """Fail this actor now, from any of its threads or tasks; its owner is told.

        Monarch's ``Instance.kill``. Unlike `abort()` it raises nothing: the
        current message runs on, later calls get ``SupervisionError``, and the
        owner's supervision sees a failure whose reason says it was killed.
        """
        if self._cell is None:
            raise RuntimeError("kill() on an instance can only be called by an actor")
        why = reason if reason is not None else "kill() was called"
        self._cell.fail(f"actor {self._cell._label()} was killed: {why}", "")

    @property
    def _children(self) -> list[Any] | None:
        """The proc meshes and actor meshes this instance spawned and has not stopped
        (``None`` when there are none), as Monarch's ``Instance._children``, which its
        test helpers read to stop what a test left running."""
        actors, procs = owned.owned_by(self._home(), self.actor_id)
        shown = (m.mesh for m in actors if not getattr(m.ref.cls, "_danaus_internal", False))
        children = [*procs, *shown]
        return children or None

    @_children.setter
    def _children(self, keep: list[Any] | None) -> None:
        """Monarch's helpers write back the children they did not stop. A danaus mesh
        leaves this list by itself when it stops, so there is nothing to record; a
        value that is not a list of this instance's children is a ``ValueError``."""
        mine = {id(c) for c in self._children or []}
        stray = [c for c in keep or [] if id(c) not in mine]
        if stray:
            raise ValueError(f"{stray!r} are not meshes {self} spawned and has not stopped")

    # Monarch's flag for infrastructure actors; introspection (stats) reports it.
    is_system = False

    def set_system(self) -> None:
        """Mark this actor as system/infrastructure (Monarch's ``Instance.set_system``):
        ``stats()`` reports it with ``is_system`` true, so tools can tell it from user actors."""
        self.is_system = True

    def stop(self, reason: str = "stopped by itself") -> None:
        """Stop this actor once the current message is done (a clean stop, not a failure)."""
        if self._cell is None:
            raise RuntimeError("stop() on an instance can only be called by an actor")
        self._cell.stop(None, 0, reason)

    def __str__(self) -> str:
        if self.creator is None:
            return "<root>"
        return display_name(
            str(self.creator), self.class_module, self.class_name, self.name, self.rank
        )

    def __repr__(self) -> str:
        return f"Instance({self})"


def display_name(creator: str, module: str, qualname: str, name: str, point: Point) -> str:
    """Monarch's name of an actor, e.g. ``<root>.<train.Trainer trainer{'gpus': 0/2}>``: its
    creator's name, then its class (with module), mesh name and point; no point when the
    mesh has no dimensions. Supervision reports and the actor log prefix use it."""
    cls = f"{module}.{qualname}" if module else qualname
    coords = str(point) if len(point.extent) else ""
    return f"{creator}.<{cls} {name}{coords}>"


class Context:
    """``actor_instance``: the running actor; ``message_rank``: its point in the mesh messaged."""

    def __init__(
        self, actor_instance: Instance, message_rank: Point, chain: tuple[Any, ...] = ()
    ) -> None:
        self.actor_instance = actor_instance
        self.message_rank = message_rank
        self._chain = chain  # actors waiting (transitively) on the message being handled

    def __repr__(self) -> str:
        return f"Context({self.actor_instance}, message_rank={self.message_rank})"


class ProcMeshOf:
    """How ``Instance.proc`` makes a one-proc mesh of a proc (a part of the node).

    ``ProcMesh`` belongs to the actor API, above this module: its installer
    (``danaus._actor.api.procs.install``) sets ``make``.
    """

    def __init__(self) -> None:
        self.make: Callable[[ProcId], _ProcMesh] | None = None


_current: contextvars.ContextVar[Context | None] = contextvars.ContextVar(
    "danaus_context", default=None
)


class _Root:
    """The context of code outside any actor in this process (a part of its node)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # guards ctx, made on first use
        self.ctx: Context | None = None


def _root_context(node: Node | None = None) -> Context:
    """``node``'s root context, made on first use; None: this process's node, looked up
    (the public face: `context()` outside any actor holds nothing else)."""
    if node is None:
        node = this_node()
    root = node.part(_Root)
    if root.ctx is not None:
        return root.ctx
    with root.lock:
        if root.ctx is None:
            rt = node.runtime
            boot_instance = rt.boot.get("instance") if rt.boot else None
            if boot_instance is not None:
                boot_instance._node = node
            inst = boot_instance or Instance(
                ActorId(rt.proc_id, "root", 0),
                "root",
                Point(0, _EMPTY),
                "RootClient",
                None,
                node=node,
            )
            root.ctx = Context(inst, Point(0, _EMPTY))
        return root.ctx


def refresh_root(node: Node) -> None:
    """The client's address changed (it started listening on TCP): re-address its root."""
    ctx = node.part(_Root).ctx
    if ctx is not None and ctx.actor_instance.creator is None:
        ctx.actor_instance.actor_id = ActorId(node.runtime.proc_id, "root", 0)


def set_context(ctx: Context) -> contextvars.Token[Context | None]:
    return _current.set(ctx)


@contextlib.contextmanager
def acting_as(ctx: Context) -> Iterator[None]:
    """Run the block as ``ctx``'s actor: what it sends, that actor sends.

    For a helper thread that sends on an actor's behalf (the tensor engine's
    sender sends as its owner actor, so that undeliverable messages and
    failures go there). The block does not carry ``ctx``'s message chain.
    """
    token = _current.set(Context(ctx.actor_instance, ctx.message_rank))
    try:
        yield
    finally:
        _current.reset(token)


def context() -> Context:
    """The current context: inside an endpoint, the actor and message; else the client's root.

    Example:

        rank = context().actor_instance.rank
    """
    ctx = _current.get()
    if ctx is not None:
        return ctx
    tl = getattr(_thread_ctx, "ctx", None)
    return tl if tl is not None else _root_context()


# Per thread, not a node part: the context of an actor's own thread, outside any message.
_thread_ctx = threading.local()


def root_context() -> Context:
    """The context of code outside any actor in this process (its node's root client)."""
    return _root_context()


def root_if_outside(node: Node | None) -> Context | None:
    """``node``'s root context (`root_context()`, made on first use) when this thread runs
    outside any actor; None inside one or acting as one (`acting_as`), where the root
    is neither needed nor made: a proc whose root context exists names its log lines
    after it, so a stream thread sending as its actor must not make it."""
    if _current.get() is not None or getattr(_thread_ctx, "ctx", None) is not None:
        return None
    return _root_context(node)


def sender(root: Context | None) -> tuple[ActorId | None, tuple[ActorId, ...]]:
    """Who a call sent now comes from (None outside an actor) and the chain it carries:
    the actors waiting (transitively) on the message being handled, plus this actor.

    ``root``: the root context (`root_context()`) of the node the call's mesh
    belongs to, which its route holds: used outside any actor, with no lookup
    (None where the route has none: then it is looked up, if needed).
    """
    ctx = _current.get()
    if ctx is None:
        ctx = getattr(_thread_ctx, "ctx", None) or root or _root_context()
    inst = ctx.actor_instance
    if inst._cell is None:
        return None, ctx._chain
    return inst.actor_id, (*ctx._chain, inst.actor_id)


def current_rank() -> Point:
    """The rank of this actor within the mesh that the current message was sent to."""
    return context().message_rank


def current_size() -> dict[str, int]:
    """The sizes of the mesh that the current message was sent to."""
    return dict(context().message_rank.extent)


def current_actor_name() -> str:
    """The current actor's unique id as a string, as Monarch gives it (never blocks).

    Every actor of a mesh has its own: ``"<proc>/<mesh id>[<rank>]"``, e.g.
    ``"p3/trainers-1a2b[0]"``; the client's is ``"<proc>/root[0]"``. The name
    the actor was spawned with is ``context().actor_instance.name``.
    """
    return str(context().actor_instance.actor_id)
