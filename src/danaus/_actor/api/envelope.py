"""What an actor mesh's messages carry: the endpoint they name, their headers, the arguments.

`Method` is an endpoint as its messages name it; `Headers` builds
every ``Call`` and ``Cast`` header an actor mesh sends (stops included), the
one place that fills them in; `encode_args()` binds and pickles a call's
arguments. Used by the routes (``route.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ... import _config as config
from ..._errors import SupervisionError
from ..._mesh import Extent, Point
from ..._wire import codec
from ..._wire.protocol import CALL_TEMPLATE_PORT_LIMIT, Call, CallTemplate, Cast
from ..core import telemetry
from ..core.context import display_name

if TYPE_CHECKING:
    from ..._mesh import Shape
    from ..._mesh.tree import Selection
    from ..._wire.ids import ActorId, PortId, ProcId
    from ..core.endpoints import EndpointProperty

__all__ = ["Headers", "Method", "encode_args", "stopped"]

_HEADERS_KEPT = 256  # header templates kept per endpoint
_UNKNOWN: Any = object()


class Method:
    """One endpoint as its messages name it: the method, its flags, and how errors name
    the call (``what``); it caches the ``Call`` header's pickle per rank, slot, sender,
    chain and trace context (only the reply port's number differs between calls; a
    traced call's context is cached from its second use, as calls in one span share it)."""

    __slots__ = ("arity", "flags", "name", "prop", "templates", "trace", "what")

    def __init__(self, mesh_name: str, name: str, prop: EndpointProperty, flags: int) -> None:
        self.name = name
        self.prop = prop
        self.arity = prop.arity  # positional arguments that need no binding check (or None)
        self.flags = flags
        self.what = f"{mesh_name}.{name}()"
        self.templates: dict[tuple[Any, ...], CallTemplate | None] = {}
        self.trace: Any = None  # the trace context of the last traced call

    def pickled(self, me: ProcId, header: Call) -> bytes | None:
        """The pickle of ``wire(header)`` from the cached template; None when there is
        no reply port of ``me`` or no template."""
        port = header.port
        if port is None or port.port >= CALL_TEMPLATE_PORT_LIMIT or port.proc != me:
            return None
        trace = header.trace  # the span's context (issue 41): cached from its second call
        if trace is not None and trace != self.trace:
            self.trace = trace
            return None
        key = (header.rank, header.slot, header.sender, header.chain, me, trace)
        tmpl = self.templates.get(key, _UNKNOWN)  # one lookup: another thread may clear
        if tmpl is _UNKNOWN:
            try:
                tmpl = CallTemplate(header)
            except ValueError:
                tmpl = None
            if len(self.templates) >= _HEADERS_KEPT:  # many ranks, senders or chains
                self.templates.clear()
            self.templates[key] = tmpl
        return tmpl.pickled(port.port) if tmpl is not None else None


class Headers:
    """Every header an actor mesh's messages carry, built here and nowhere else."""

    __slots__ = ("labels", "mesh_id", "name", "size", "sizes")

    def __init__(self, mesh_id: str, name: str, size: int, shape: Shape) -> None:
        self.mesh_id = mesh_id
        self.name = name
        self.size = size  # actors in the whole mesh
        ext = shape.extent
        self.labels = tuple(ext.labels)  # each message's rank is relative to this slice
        self.sizes = tuple(ext.sizes)

    def call(
        self,
        method: Method,
        rank: int,
        slot: int,
        port: PortId | None,
        sender: ActorId | None,
        chain: tuple[ActorId, ...],
    ) -> Call:
        """A ``CALL`` of ``method`` to actor ``rank``, its reply to ``port``'s ``slot``."""
        # tuple.__new__: every field given, so NamedTuple's own __new__ (a Python
        # function, one call per message) has nothing to add.
        return tuple.__new__(Call, (
            self.mesh_id, rank, method.name, port, slot, self.labels, self.sizes, sender,
            chain, method.flags, telemetry.outgoing() if telemetry.ON else None,
        ))  # fmt: skip

    def cast(
        self,
        method: str,
        flags: int,
        gather: bool,
        port: PortId | None,
        selection: Selection,
        sender: ActorId | None,
        chain: tuple[ActorId, ...],
        *,
        traced: bool = True,
    ) -> Cast:
        """A ``CAST`` of ``method`` to the ``selection`` of the whole mesh, sent to its
        root; ``traced``: it carries the caller's telemetry span (a stop does not)."""
        return Cast(
            self.mesh_id, self.name, method, port, gather, selection.to_wire(), 0, self.size,
            config.values.tree_fanout, None, self.labels, self.sizes, sender, chain, flags, 0,
            telemetry.outgoing() if traced and telemetry.ON else None,
        )  # fmt: skip


def encode_args(prop: EndpointProperty, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Bind and pickle; raises ``TypeError`` naming the argument that cannot be pickled."""
    prop.bind(args, kwargs)
    try:
        return codec.dumps((args, kwargs))
    except Exception as e:
        params = list(prop.signature.parameters)[2 if prop.explicit_response_port else 1 :]
        names = [
            f"argument {params[i]!r} (position {i})" if i < len(params) else f"argument {i}"
            for i in range(len(args))
        ] + [f"argument {k!r}" for k in kwargs]
        for name, value in zip(names, [*args, *kwargs.values()], strict=True):
            try:
                codec.dumps(value)
            except Exception as inner:
                raise TypeError(
                    f"{name} of {prop.name}() cannot be pickled ({type(inner).__name__}: "
                    f"{inner}): {value!r:.200}. Arguments travel to other processes, so they "
                    "must be picklable; pass plain data instead, or give the type a __reduce__"
                ) from inner
        raise TypeError(f"the arguments of {prop.name}() cannot be pickled: {e}") from e


def stopped(ref: Any) -> SupervisionError:
    """The error of a call to the stopped actor mesh ``ref`` (Monarch's sentence first:
    programs match on it)."""
    owner = ref.owner
    root = owner is None or owner.mesh == "root"
    creator = "<root>" if root else f"<{owner.mesh}[{owner.rank}]>"
    cls = ref.cls
    nowhere = Point(0, Extent([], []))
    who = display_name(creator, cls.__module__, cls.__qualname__, ref.name, nowhere)
    return SupervisionError(
        f"The actor {who} and all its descendants have failed:\n"
        f"  actor mesh {ref.name!r} was stopped; spawn a new one to keep working",
        actor=ref.name,
        reason="stopped",
        during="call",
    )
