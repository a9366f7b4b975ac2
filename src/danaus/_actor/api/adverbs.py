"""Adverbs: how a message reaches a mesh — ``call``, ``call_one``, ``choose``, ``stream``,
``broadcast``.

Every adverb binds the arguments against the endpoint's signature and
pickles them once, on the caller's thread, before anything is sent: a wrong
call raises ``TypeError`` at the call site. The encoded body is then written
to each destination proc's connection, so each sender→actor pair stays FIFO.

A mesh of at least ``tree_min_ranks`` actors is messaged through its cast
tree instead (``danaus._runtime.messaging.tree``), every message to it, whatever it
selects: the path from this proc to each actor is then always the same, so
FIFO holds per destination. ``call()`` gathers replies up the tree;
``stream()``, ``call_one``, ``choose`` and port sends have each reply come
straight back, as soon as it is ready.
"""

from __future__ import annotations

import concurrent.futures
import functools
import random
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any, Concatenate, Generic, Literal, ParamSpec, TypeVar, overload

from ... import _config as config
from ..._errors import SupervisionError
from ..._mesh import Extent, Point, ValueMesh
from ..._mesh.tree import Selection
from ..._runtime.hosting import host
from ..._wire import codec
from ..._wire.frame import flat
from ..._wire.ids import ProcId
from ..._wire.protocol import CALL_TEMPLATE_PORT_LIMIT, Call, CallTemplate, Cast
from ..core import handoff, owned, telemetry
from ..core.cell import FLAG_AS_ENDPOINT, FLAG_EXPLICIT
from ..core.collect import (
    Collector,
    Countdown,
    GatherCollector,
    OneCall,
    TreeCollector,
    set_future,
    wait_ready,
)
from ..core.context import context, display_name
from ..core.endpoints import EndpointProperty
from ..core.future import Deferred, Future, Pending, resolve
from ..core.ports import Port
from ..core.undeliverable import return_to_sender
from .extensions import tensor_engine

if TYPE_CHECKING:
    from ..._runtime.messaging.runtime import Runtime
    from ..._wire.ids import PortId
    from .mesh import ActorMesh

__all__ = ["Accumulator", "Endpoint", "NotAnEndpoint", "as_endpoint", "send"]

P = ParamSpec("P")
R = TypeVar("R")
A = TypeVar("A")


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


_HEADERS_KEPT = 256  # header templates kept per endpoint
_UNKNOWN: Any = object()


class Endpoint(Generic[P, R]):
    """An endpoint of a mesh; pick an adverb to send a message.

    Generic in the endpoint method's parameters ``P`` (after ``self``) and its
    result ``R`` (what it returns or awaits, or what its response port carries),
    as Monarch's ``Endpoint[P, R]``: ``call_one``/``choose`` give a
    ``Future[R]``, ``call`` a ``Future[ValueMesh[R]]``, ``stream`` an iterator
    of ``Future[R]``, and a type checker flags arguments that do not fit ``P``
    (at run time they raise ``TypeError`` before anything is sent).
    """

    def __init__(
        self, mesh: ActorMesh[Any], name: str, prop: EndpointProperty, flags: int = 0
    ) -> None:
        self._mesh = mesh
        self._name = name
        self._prop = prop
        self._flags = flags | (FLAG_EXPLICIT if prop.explicit_response_port else 0)
        self._what = f"{mesh._ref.name}.{name}()"
        # (rank, slot, sender, chain, our proc id, trace context) -> the CALL header's template
        self._headers: dict[tuple[Any, ...], CallTemplate | None] = {}
        self._trace: Any = None  # the trace context of the last traced call_one
        self._direct: bool | None = None  # not messaged through the cast tree

    def _targets(self) -> list[tuple[int, int, ProcId]]:
        """``(index in this slice, rank in the whole mesh, proc)`` for each actor addressed."""
        cached = self._mesh.__dict__.get("_targets")
        if cached is None:  # a mesh's shape never changes: compute once per mesh object
            procs = self._mesh._ref.procs
            cached = [(i, r, procs[r]) for i, r in enumerate(self._mesh._shape.ranks())]
            self._mesh.__dict__["_targets"] = cached
        return list(cached)

    def _encode(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        targets: list[tuple[int, int, ProcId]] | None = None,
    ) -> Any:
        """Pickle the arguments for ``targets`` (all the mesh's actors when ``None``).

        Arguments handed off on the receiving procs (distributed tensors, see
        ``handoff``) are announced to their provider here, which may refuse.
        """
        if codec.small_plain((args, kwargs)):
            # Atoms only: nothing in them can be handed off, no capture needed.
            payload = encode_args(self._prop, args, kwargs)
            self._mesh._check_usable()
            return payload
        with handoff.capture() as cap:
            payload = encode_args(self._prop, args, kwargs)
        self._mesh._check_usable()
        if cap.refs:
            actors = tuple((r, p) for _, r, p in (self._targets() if targets is None else targets))
            payload = cap.wrap(
                payload, handoff.Recipients(self._mesh._ref.mesh_id, self._what, actors)
            )
        return payload

    def _send(
        self,
        payload: Any,
        targets: list[tuple[int, int, ProcId]],
        collector: Collector | _PortSink | None,
        *,
        to_failed: bool = False,
    ) -> None:
        """Send ``payload`` to ``targets``. A broadcast (no ``collector``) to a rank known
        to have failed raises ``SupervisionError``, unless ``to_failed``: a hand-off
        whose results are already promised goes to every rank, and a failed actor's
        proc fails its part of the results (whether or not we knew in time)."""
        if self._tree_mode():
            self._send_tree(payload, targets, collector, to_failed=to_failed)
            return
        body, bufs = payload
        if collector is None and bufs:
            # A broadcast has no completion to wait for before reusing the arrays:
            # send a snapshot of them.
            bufs = [bytes(flat(b)) for b in bufs]
        rt = host.ensure_runtime()
        ctx = context()
        inst = ctx.actor_instance
        sender = inst.actor_id if inst._cell is not None else None
        chain = ctx._outgoing_chain() if collector is not None else ()
        labels, sizes = self._mesh._labels_sizes()
        mesh_id = self._mesh._ref.mesh_id
        port = collector.port if collector is not None else None
        failed = [] if to_failed else [(i, r, self._mesh._failed_reason(r)) for i, r, _ in targets]
        failed = [f for f in failed if f[2] is not None]
        if failed and collector is None:
            _, rank, reason = failed[0]
            raise SupervisionError(
                f"cannot broadcast {self._what}: actor {self._mesh._ref.name}[{rank}] has "
                f"failed: {reason}; slice the mesh to its healthy ranks",
                actor=f"{self._mesh._ref.name}[{rank}]",
                reason=str(reason),
            )
        skip = {i for i, _, _ in failed}
        if collector is not None:
            name = self._mesh._ref.name
            for index, rank, reason in failed:
                collector.fail_supervision(index, _failed(self._mesh, rank, reason))
            for index, rank, proc in targets:
                if index not in skip:
                    collector.expect(index, proc, f"{name}[{rank}]")
        tracer = rt.tracer
        t0 = tracer.now() if tracer is not None else 0
        carried = telemetry.outgoing() if telemetry.ON else None
        for index, rank, proc in targets:
            if index in skip:
                continue
            header = Call(
                mesh_id,
                rank,
                self._name,
                port,
                index,
                labels,
                sizes,
                sender,
                chain,
                self._flags,
                carried,
            )
            on_fail = (
                functools.partial(collector.fail, index)
                if collector is not None
                else functools.partial(
                    return_to_sender, sender, f"{self._mesh._ref.name}[{rank}].{self._name}()"
                )
            )
            pickled = None if bufs else self._pickled_header(rt, header)
            rt.send(proc, header, body, bufs, on_fail, pickled=pickled)
        if tracer is not None:
            flows = (
                tuple(f"c:{port.proc.name}:{port.port}:{i}" for i, _, _ in targets if i not in skip)
                if port is not None
                else None
            )
            args = {"mesh": self._mesh._ref.name, "actors": len(targets), "bytes": len(body)}
            tracer.span(f"send {self._what}", "send", t0, args, flow_out=flows)

    # -- the cast tree ------------------------------------------------------------

    def _tree_mode(self) -> bool:
        """Whether this mesh is messaged through its cast tree (decided once per mesh)."""
        return bool(
            host.ensure_runtime().tree.use_tree(self._mesh._ref.mesh_id, self._mesh._ref.procs)
        )

    def _cast_header(self, gather: bool, port: PortId | None, selection: Selection) -> Cast:
        ctx = context()
        inst = ctx.actor_instance
        labels, sizes = self._mesh._labels_sizes()
        return Cast(
            self._mesh._ref.mesh_id,
            self._mesh._ref.name,
            self._name,
            port,
            gather,
            selection.to_wire(),
            0,
            len(self._mesh._ref.procs),
            config.get("tree_fanout"),
            None,
            labels,
            sizes,
            inst.actor_id if inst._cell is not None else None,
            ctx._outgoing_chain() if port is not None or gather else (),
            self._flags,
            0,
            telemetry.outgoing() if telemetry.ON else None,
        )

    def _known_failed(self, selection: Selection) -> list[tuple[int, int, str]]:
        """``(slot, rank, why)`` of the selected actors known to have failed."""
        failed = self._mesh._state.failed
        if not failed:
            return []
        return [(selection.slot(r), r, why) for r, why in list(failed.items()) if r in selection]

    def _await_boot(self) -> None:
        """Before the first cast down the tree: wait until every proc of the mesh has booted.

        The procs of the tree connect to each other; one that is still booting has
        no socket yet, and a forwarder that cannot connect declares it lost. The
        client that spawned the procs knows when each is up (a mesh received
        from elsewhere was pickled after its procs were up). Blocks only while
        procs are still booting, bounded as ``wait_ready``.
        """
        state = self._mesh._state
        if state.booted:
            return
        wait_ready(self._mesh._ref.procs)
        state.booted = True

    def _send_tree(
        self,
        payload: Any,
        targets: list[tuple[int, int, ProcId]] | None,
        collector: Collector | _PortSink | None,
        *,
        to_failed: bool = False,
    ) -> None:
        """Send down the cast tree; replies (if any) come straight back to ``collector``
        (``to_failed``: as in ``_send``)."""
        self._await_boot()
        body, bufs = payload
        if collector is None and bufs:
            bufs = [bytes(flat(b)) for b in bufs]  # nothing tells a broadcast's caller when
        rt = host.ensure_runtime()
        procs = self._mesh._ref.procs
        if targets is None or len(targets) == len(self._mesh._shape):
            selection = Selection.of(self._mesh._shape.ndslice)
        else:
            order = sorted(targets, key=lambda t: t[1])
            selection = Selection._listed(tuple(t[1] for t in order), tuple(t[0] for t in order))
        failed = [] if to_failed else self._known_failed(selection)
        name = self._mesh._ref.name
        if failed and collector is None:
            _, rank, reason = failed[0]
            raise SupervisionError(
                f"cannot broadcast {self._what}: actor {name}[{rank}] has "
                f"failed: {reason}; slice the mesh to its healthy ranks",
                actor=f"{name}[{rank}]",
                reason=str(reason),
            )
        header = self._cast_header(
            False, collector.port if collector is not None else None, selection
        )
        on_fail = None
        if isinstance(collector, TreeCollector):
            assert targets is not None
            for slot, rank, why in failed:
                collector.fail_supervision(slot, _failed(self._mesh, rank, why))
            for index, rank, proc in targets:
                collector.expect(index, proc, f"{name}[{rank}]")
            collector.expect_tree(targets, procs, ancestors=len(targets) < len(procs))

            def on_fail(slot: int, rank: int, why: str) -> None:
                collector.fail(slot, why)

        elif collector is not None:  # a user's port: as the direct path, nothing is watched
            sink = collector

            def on_fail(slot: int, rank: int, why: str) -> None:
                sink.fail(slot, why)

        else:

            def on_fail(slot: int, rank: int, why: str) -> None:
                return_to_sender(header.sender, f"{name}[{rank}].{self._name}()", why)

        rt.tree.cast(procs, selection, header, body, bufs, on_fail=on_fail)

    def _call_tree(self, payload: Any) -> Future[ValueMesh[Any]]:
        """``call()`` through the tree, replies gathered one message per subtree."""
        shape = self._mesh._shape
        n = len(shape)
        cf: concurrent.futures.Future[Any] = concurrent.futures.Future()
        if n == 0:
            cf.set_result(ValueMesh(shape, []))
            return Future._create(cf, self._what)
        values: list[Any] = [None] * n
        left = [n]
        lock = threading.Lock()  # guards left, the slots still due

        def on_values(slots: Any, got: Any) -> None:
            for slot, value in zip(slots, got, strict=True):
                values[slot] = value
            with lock:
                left[0] -= len(slots)
                last = left[0] == 0
            if last:
                set_future(cf, True, _value_mesh(shape, values))

        def on_value(index: int, ok: bool, value: Any) -> None:
            if not ok:
                set_future(cf, False, value)
                return
            on_values((index,), (value,))

        self._await_boot()
        rt = host.ensure_runtime()
        selection = Selection.of(shape.ndslice)
        name = self._mesh._ref.name
        collector = GatherCollector(rt, self._what, name, n, selection, on_value, on_values)
        for slot, rank, why in self._known_failed(selection):
            collector.fail_supervision(slot, f"actor {name}[{rank}] has failed: {why}")
        header = self._cast_header(True, None, selection)
        rt.tree.cast(self._mesh._ref.procs, selection, header, *payload, root=collector.root)
        return Future._create(cf, self._what)

    def call(self, *args: P.args, **kwargs: P.kwargs) -> Future[ValueMesh[R]]:
        """Send to every actor of the mesh; the future holds a ``ValueMesh`` of the replies.

        Does not block. The future raises ``ActorError`` if any actor raised, and
        ``SupervisionError`` if an actor's proc died.
        """
        if self._tree_mode():
            return self._call_tree(self._encode(args, kwargs))
        targets = self._targets()
        payload = self._encode(args, kwargs, targets)
        cf: concurrent.futures.Future[Any] = concurrent.futures.Future()
        values: list[Any] = [None] * len(targets)
        shape = self._mesh._shape
        # Replies arrive on the I/O thread, failures to send on the caller's: count safely.
        countdown = Countdown(
            len(targets), lambda: set_future(cf, True, _value_mesh(shape, values))
        )
        if not targets:
            return Future._create(cf, self._what)

        def on_value(index: int, ok: bool, value: Any) -> None:
            if not ok:
                set_future(cf, False, value)
                return
            values[index] = value
            countdown.tick()

        collector = Collector(host.ensure_runtime(), self._what, len(targets), on_value, lazy=True)
        self._send(payload, targets, collector)
        return Future._create(cf, self._what)

    def _collector(self, n: int, on_value: Any) -> Collector:
        """The collector for ``n`` replies that come straight back."""
        rt = host.ensure_runtime()
        if self._tree_mode():
            return TreeCollector(
                rt,
                self._what,
                n,
                on_value,
                mesh_size=len(self._mesh._ref.procs),
                fanout=config.get("tree_fanout"),
                lazy=True,
            )
        return Collector(rt, self._what, n, on_value, lazy=True)

    def _one(
        self,
        targets: list[tuple[int, int, ProcId]],
        args: Any,
        kwargs: Any,
        payload: Any = None,
    ) -> Future[Any]:
        if payload is None:
            payload = self._encode(args, kwargs, targets)
        cf: concurrent.futures.Future[Any] = concurrent.futures.Future()
        collector = self._collector(1, lambda i, ok, v: set_future(cf, ok, v))
        self._send(payload, targets, collector)
        return Future._create(cf, self._what)

    def call_one(self, *args: P.args, **kwargs: P.kwargs) -> Future[R]:
        """Call the only actor of a one-actor mesh. ``ValueError`` (before sending) otherwise."""
        targets = self._mesh.__dict__.get("_targets")
        if targets is None:
            targets = self._targets()
        if len(targets) != 1:
            raise ValueError(
                f"call_one requires exactly 1 actor, but mesh {self._mesh._ref.name!r} has "
                f"{len(targets)}; slice it first (e.g. mesh.slice(gpus=0)) or use call()"
            )
        direct = self._direct
        if direct is None:
            direct = self._direct = not self._tree_mode()
        rt = host.ensure_runtime()
        if direct and rt.tracer is None and not self._mesh._state.failed:
            payload = self._encode(args, kwargs)
            if not payload[1]:
                return self._call_one_fast(rt, targets[0], payload[0])
            return self._one(list(targets), args, kwargs, payload)
        return self._one(list(targets), args, kwargs)

    def _call_one_fast(
        self, rt: Runtime, target: tuple[int, int, ProcId], body: bytes
    ) -> Future[Any]:
        """``call_one`` of plain arguments (no buffers) to a healthy actor, not traced:
        a light port and future, and the header's pickle cached per endpoint."""
        index, rank, proc = target
        ctx = context()
        inst = ctx.actor_instance
        sender = inst.actor_id if inst._cell is not None else None
        chain = ctx._outgoing_chain()
        fut = Pending()
        call = OneCall(rt, self._what, proc, f"{self._mesh._ref.name}[{rank}]", fut)
        port = call.port
        labels, sizes = self._mesh._labels_sizes()
        header = Call(
            self._mesh._ref.mesh_id, rank, self._name, port, index,
            labels, sizes, sender, chain, self._flags,
            telemetry.outgoing() if telemetry.ON else None,
        )  # fmt: skip
        rt.send(proc, header, body, (), call.fail, pickled=self._pickled_header(rt, header))
        fut.reader = rt.reader_for(proc)  # its waiter may read the reply itself
        return Future._create(fut, self._what)

    def _pickled_header(self, rt: Runtime, header: Call) -> bytes | None:
        """The pickle of ``wire(header)``, from a template cached per rank, slot, sender
        and chain (only the reply port's number differs between calls); None when
        there is no port or no template."""
        port = header.port
        if port is None or port.port >= CALL_TEMPLATE_PORT_LIMIT or port.proc != rt.proc_id:
            return None
        trace = header.trace  # the span's context (issue 41): cached from its second call
        if trace is not None and trace != self._trace:
            self._trace = trace
            return None
        key = (header.rank, header.slot, header.sender, header.chain, rt.proc_id, trace)
        tmpl = self._headers.get(key, _UNKNOWN)  # one lookup: another thread may clear
        if tmpl is _UNKNOWN:
            try:
                tmpl = CallTemplate(header)
            except ValueError:
                tmpl = None
            if len(self._headers) >= _HEADERS_KEPT:  # many ranks, senders or chains
                self._headers.clear()
            self._headers[key] = tmpl
        return tmpl.pickled(port.port) if tmpl is not None else None

    def choose(self, *args: P.args, **kwargs: P.kwargs) -> Future[R]:
        """Call one actor of the mesh, chosen at random (load balancing)."""
        targets = self._targets()
        if not targets:
            raise ValueError(f"choose() on the empty mesh {self._mesh._ref.name!r}")
        # The chosen actor sees its own position in the mesh as its message rank.
        return self._one([random.choice(targets)], args, kwargs)

    def stream(self, *args: P.args, **kwargs: P.kwargs) -> Iterator[Future[R]]:
        """Call every actor; yield one future per actor, in the order replies arrive."""
        targets = self._targets()
        payload = self._encode(args, kwargs, targets)
        cfs: list[concurrent.futures.Future[Any]] = [concurrent.futures.Future() for _ in targets]
        arrived = [0]

        def on_value(index: int, ok: bool, value: Any) -> None:
            k = arrived[0]
            arrived[0] += 1
            set_future(cfs[k], ok, value)

        if targets:
            self._send(payload, targets, self._collector(len(targets), on_value))
        return iter([Future._create(cf, self._what) for cf in cfs])

    def broadcast(self, *args: P.args, **kwargs: P.kwargs) -> None:
        """Send to every actor without waiting for anything (fire and forget).

        An exception in the endpoint fails the actor (there is no caller to tell).
        """
        if self._tree_mode():
            self._send_tree(self._encode(args, kwargs), None, None)
            return
        self._send(self._encode(args, kwargs), self._targets(), None)

    def rref(self, *args: P.args, **kwargs: P.kwargs) -> Any:
        """Call every actor; their results become distributed tensors (tensor engine).

        Needs torch. The endpoint's ``propagate`` function gives the results'
        shapes from meta tensors on the client, so this returns at once: the
        mesh tensors (in the structure ``propagate`` returned) of the mesh of
        the distributed tensors passed, or of the active mesh. The actors must
        be one per proc of that mesh. The call is ordered with the tensor ops
        of the active stream both ways, as a call with tensor arguments is; an
        endpoint that raises fails the result tensors, not the actor. See
        ``docs/tensor.md``.
        """
        return tensor_engine().actor_rref(self, args, kwargs)

    def _send_returning(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        hand_off: Any,
    ) -> None:
        """Send to every actor with no reply port; the outcome of each call goes to the
        producers on its proc, which ``hand_off(key, count, refs, recipients)`` sets up
        (it may raise, before anything is sent). See ``handoff``."""
        targets = self._targets()
        with handoff.capture() as cap:
            payload = encode_args(self._prop, args, kwargs)
        self._mesh._check_usable()
        actors = tuple((r, p) for _, r, p in targets)
        recipients = handoff.Recipients(self._mesh._ref.mesh_id, self._what, actors)
        self._send(cap.wrap(payload, recipients, hand_off=hand_off), targets, None, to_failed=True)

    def _send_to_port(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        port: Port[Any] | None,
        selection: str,
    ) -> None:
        """The primitive under the adverbs: replies (one per actor) go to ``port``."""
        targets = self._targets()
        if selection == "choose":
            targets = [random.choice(targets)] if targets else []
        elif selection != "all":
            raise ValueError(f"selection must be 'all' or 'choose', got {selection!r}")
        payload = self._encode(args, kwargs, targets)
        if port is None:
            self._send(payload, targets, None)
            return
        forward = _PortSink(port, len(targets))
        self._send(payload, targets, forward)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Any:
        """Not on a mesh: raises ``TypeError`` (pick an adverb). Typed for the one place
        the call is right: inside the actor, ``self.method(...)`` is the bound method,
        which a type checker sees as this endpoint."""
        raise TypeError(
            f"endpoint {self._name}() of an actor mesh cannot be called directly; pick an "
            f"adverb: .call(), .call_one(), .choose(), .stream(), .broadcast() or .rref()"
        )

    def __repr__(self) -> str:
        return f"<Endpoint {self._what}>"


class _PortSink:
    """Stands in for a collector when replies go to a user's port: forwards each one."""

    def __init__(self, port: Port[Any], n: int) -> None:
        self._port = port
        self.port = port._port_id

    def expect(self, index: int, proc: ProcId, label: str = "") -> None:
        pass

    def fail(self, index: int, reason: str) -> None:
        self._port.exception(SupervisionError(f"message undeliverable: {reason}", reason=reason))

    def fail_supervision(self, index: int, why: str) -> None:
        self._port.exception(SupervisionError(why, reason=why))


def send(
    endpoint: Endpoint[P, R] | Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    port: Port[R] | None = None,
    selection: Literal["all", "choose"] = "all",
) -> None:
    """Send ``endpoint(*args, **kwargs)`` to its mesh; each actor's reply goes to ``port``.

    ``endpoint`` is an endpoint of an actor mesh (``mesh.method``) or, as in
    Monarch, a remote function (``danaus.remote``: one reply per proc of the
    active mesh). ``selection`` is ``"all"`` or ``"choose"`` (one actor at
    random). Does not block.
    """
    if not isinstance(endpoint, Endpoint) and not hasattr(endpoint, "_send_to_port"):
        raise TypeError(
            "send() needs an endpoint of an actor mesh (mesh.method) or a remote function, "
            f"got {endpoint!r}"
        )
    endpoint._send_to_port(tuple(args), dict(kwargs), port, selection)


@overload
def as_endpoint(
    not_an_endpoint: Callable[P, Awaitable[R]],
    *,
    propagate: Any = None,
    explicit_response_port: Literal[False] = False,
) -> Endpoint[P, R]: ...


@overload
def as_endpoint(
    not_an_endpoint: Callable[P, R],
    *,
    propagate: Any = None,
    explicit_response_port: Literal[False] = False,
) -> Endpoint[P, R]: ...


@overload
def as_endpoint(
    not_an_endpoint: Callable[Concatenate[Port[R], P], Awaitable[None] | None],
    *,
    propagate: Any = None,
    explicit_response_port: Literal[True],
) -> Endpoint[P, R]: ...


def as_endpoint(
    not_an_endpoint: Any,
    *,
    propagate: Any = None,
    explicit_response_port: bool = False,
) -> Endpoint[Any, Any]:
    """Make a plain method of an actor mesh callable with the adverbs.

    ``as_endpoint(mesh.helper).call(...)``. Raises ``TypeError`` for anything
    but a mesh's non-endpoint method.
    """
    if isinstance(not_an_endpoint, Endpoint):
        return not_an_endpoint
    if not isinstance(not_an_endpoint, NotAnEndpoint):
        raise TypeError(
            f"as_endpoint() takes a method of an actor mesh (mesh.method), got {not_an_endpoint!r}"
        )
    mesh, name = not_an_endpoint._mesh, not_an_endpoint._name
    fn = getattr(mesh._ref.cls, name)
    prop = EndpointProperty(fn, propagate=propagate, explicit_response_port=explicit_response_port)
    ep: Endpoint[Any, Any] = Endpoint(mesh, name, prop, FLAG_AS_ENDPOINT)
    return ep


class Accumulator(Generic[P, R, A]):
    """A client-side left fold over the replies of an endpoint, in arrival order.

    ``Accumulator(mesh.value, 0, operator.add).accumulate().get()``; an empty
    mesh yields ``identity``.
    """

    def __init__(self, endpoint: Endpoint[P, R], identity: A, combine: Callable[[A, R], A]) -> None:
        if not isinstance(endpoint, Endpoint):
            raise TypeError(f"Accumulator needs an actor mesh's endpoint, got {endpoint!r}")
        self._endpoint = endpoint
        self._identity = identity
        self._combine = combine

    def accumulate(self, *args: P.args, **kwargs: P.kwargs) -> Future[A]:
        """Call every actor; the future holds ``combine(...combine(identity, r1)..., rn)``."""
        futures = list(self._endpoint.stream(*args, **kwargs))
        cf: concurrent.futures.Future[Any] = concurrent.futures.Future()
        arrived: list[Any] = []  # replies in arrival order, folded by whoever reads cf
        lock = threading.Lock()  # guards arrived (against cf completing)
        if not futures:
            cf.set_result(self._identity)

        def fold() -> Any:
            acc = self._identity
            for reply in arrived:
                acc = self._combine(acc, resolve(reply))
            return acc

        def one(f: Future[Any]) -> None:
            exc = f._cf.exception()
            with lock:
                if cf.done():
                    return
                reply = f._cf.result() if exc is None else None
                if exc is not None or not getattr(reply, "ok", True):
                    set_future(cf, False, exc if exc is not None else reply)
                    return
                arrived.append(reply)
                if len(arrived) == len(futures):
                    # The fold runs user code: on the reader's thread, not the I/O thread.
                    set_future(cf, True, Deferred(fold))

        for f in futures:
            f.add_done_callback(one)
        return Future._create(cf, f"accumulating {self._endpoint._what}")


def _value_mesh(shape: Any, values: list[Any]) -> Deferred:
    """The ``ValueMesh`` of replies, built (and each reply unpickled) by its reader."""
    return Deferred(lambda: ValueMesh(shape, [resolve(v) for v in values]))


class NotAnEndpoint:
    """A method of the actor class that is not marked ``@endpoint``.

    As in Monarch: calling it raises ``RuntimeError``, and it has no adverbs, so
    ``mesh.method.call()`` raises ``AttributeError`` (both saying what to do).
    """

    _ADVERBS = frozenset({"call", "call_one", "choose", "stream", "broadcast", "rref"})

    def __init__(self, mesh: ActorMesh[Any], name: str) -> None:
        self._mesh = mesh
        self._name = name

    def _message(self) -> str:
        return (
            f"Actor {self._mesh._ref.cls.__qualname__}.{self._name} is not annotated as an "
            "endpoint; decorate it with @endpoint (or wrap it with as_endpoint()) to call it "
            "through a mesh"
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(self._message())

    def __getattr__(self, name: str) -> Any:
        if name in NotAnEndpoint._ADVERBS:
            raise AttributeError(f"{self._message()} (so it has no .{name})", name=name, obj=self)
        raise AttributeError(name)


def _failed(mesh: Any, rank: int, reason: Any) -> str:
    """Why a call to failed actor ``rank`` of ``mesh`` fails, in Monarch's words first:
    ``The actor <root>.<mod.Cls name{'dim': i/n}> and all its descendants have failed:``."""
    ref = mesh._ref
    me = context().actor_instance
    if ref.owner is None or ref.owner.mesh == "root":
        creator = "<root>"
    elif me.actor_id == ref.owner:
        creator = str(me)
    else:
        creator = f"<{ref.owner.mesh}[{ref.owner.rank}]>"
    om = owned.get(ref.mesh_id)  # the whole mesh, where its owner is this process
    extent = (om.mesh if om is not None else mesh)._shape.extent
    if len(extent) and extent.nelements == len(ref.procs) and 0 <= rank < len(ref.procs):
        point = Point(rank, extent)  # the whole mesh: its point; a slice's is not the actor's
    else:
        point = Point(0, Extent([], []))
    cls = ref.cls
    who = display_name(creator, cls.__module__, cls.__qualname__, ref.name, point)
    return (
        f"The actor {who} and all its descendants have failed:\n  {reason}\n"
        f"  (actor {ref.name}[{rank}])"
    )
