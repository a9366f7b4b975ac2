"""A mesh's send route: how every message from this process to one actor mesh travels.

An `ActorMesh` owns one route, made when its
first endpoint is used and never changed: a `DirectRoute` writes one
``CALL`` frame per actor; a `TreeRoute` sends one ``CAST`` down the
mesh's cast tree (``danaus._runtime.messaging.tree``), for meshes of at least
``tree_min_ranks`` actors, one per proc. Which of the two is decided once per
mesh (shared by its slices, and by the runtime for other copies of the mesh,
so one mesh's messages never take two paths and FIFO holds per destination).

An `Endpoint` is a `Method` (what its
messages name) and a route: each adverb is one call into the route. The
route holds what it sends with (the runtime of the node the mesh belongs to)
and what it sends to (the mesh's reference, shape and shared state), so an
endpoint never reads the mesh.

Headers: a `Headers` per route builds every
``Call`` and ``Cast`` header an actor mesh sends (stops included); nothing else
builds them by position.
"""

from __future__ import annotations

import concurrent.futures
import functools
import pickle
import random
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from ... import _config as config
from ..._errors import SupervisionError
from ..._mesh import Extent, Point, ValueMesh
from ..._mesh.tree import Selection
from ..._runtime.messaging.tree import FLAG_STOP
from ..._wire import codec
from ..._wire.frame import flat
from ..._wire.protocol import StopActor
from ..core import handoff, owned
from ..core.collect import (
    Collector,
    Countdown,
    GatherCollector,
    OneCall,
    TreeCollector,
    set_future,
    wait_ready,
)
from ..core.context import Context, context, display_name, root_if_outside
from ..core.context import sender as sender_of
from ..core.future import Deferred, Future, Pending, resolve
from ..core.ports import Port, PortSink
from ..core.undeliverable import return_to_sender
from .envelope import Headers, Method, encode_args, stopped

if TYPE_CHECKING:
    from ..._mesh import Shape
    from ..._runtime.messaging.runtime import Runtime
    from ..._runtime.node import Node
    from ..._wire.ids import ActorId, ProcId

__all__ = ["DirectRoute", "Route", "TreeRoute"]

Target = tuple[int, int, "ProcId"]  # (index in the slice, rank in the whole mesh, proc)


def _value_mesh(shape: Any, values: list[Any]) -> Deferred:
    """The ``ValueMesh`` of replies, built (and each reply unpickled) by its reader."""
    return Deferred(lambda: ValueMesh(shape, [resolve(v) for v in values]))


class Route:
    """How one mesh object's messages travel (the parts both routes share).

    ``rt``: the runtime of the node the mesh belongs to; ``ref``, ``shape``,
    ``state``: the mesh's reference, shape and shared state. ``fixed``: the
    mesh's procs never change (a supervised mesh's do: a restart moves a rank),
    so its targets are computed once.
    """

    tree = False

    def __init__(
        self, rt: Runtime, ref: Any, shape: Shape, state: Any, fixed: bool = True, mesh: Any = None
    ) -> None:
        self.rt = rt
        self.mesh = mesh  # the mesh object that made it (an endpoint is pickled as mesh + name)
        self.ref = ref
        self.shape = shape
        self.state = state
        self.fixed = fixed
        self.headers = Headers(ref.mesh_id, ref.name, len(ref.procs), shape)
        self._targets: list[Target] | None = None
        self._root: Context | None = None  # the root context of the mesh's node, once used
        self._reader: Any = None  # the connection to a one-actor mesh's proc (call_one)

    @property
    def node(self) -> Node:
        """The node the mesh belongs to (its state has it before the route is made)."""
        node: Node | None = self.state.node
        assert node is not None, f"the route of {self.ref.name!r} was made before its node"
        return node

    # -- what it sends to ------------------------------------------------------------

    def targets(self) -> list[Target]:
        """``(index in this slice, rank in the whole mesh, proc)`` of each actor addressed."""
        cached = self._targets
        if cached is None:
            procs = self.ref.procs
            cached = [(i, r, procs[r]) for i, r in enumerate(self.shape.ranks())]
            if self.fixed:
                self._targets = cached
        return list(cached)

    def _sender(self) -> tuple[ActorId | None, tuple[ActorId, ...]]:
        """Who sends (None outside an actor) and the chain of actors blocked on the call;
        outside any actor, the root of the node the mesh belongs to (looked up once)."""
        return sender_of(self._root or self._find_root())

    def _find_root(self) -> Context | None:
        """The node's root context, kept once found; None inside an actor (its own
        context sends, and a proc's root is not made for it)."""
        root = root_if_outside(self.state.node)  # the mesh's node's root
        if root is not None:
            self._root = root
        return root

    def check_usable(self) -> None:
        if self.state.stopped:
            raise stopped(self.ref)

    def failed_reason(self, rank: int) -> str | None:
        """Why actor ``rank`` (of the whole mesh) is known to have failed, if it has."""
        failed = self.state.failed
        return failed.get(rank) if failed else None

    def failure(self, rank: int, reason: Any) -> str:
        """Why a call to failed actor ``rank`` fails, in Monarch's words first:
        ``The actor <root>.<mod.Cls name{'dim': i/n}> and all its descendants have failed:``."""
        ref = self.ref
        me = context().actor_instance
        if ref.owner is None or ref.owner.mesh == "root":
            creator = "<root>"
        elif me.actor_id == ref.owner:
            creator = str(me)
        else:
            creator = f"<{ref.owner.mesh}[{ref.owner.rank}]>"
        om = owned.get(self.node, ref.mesh_id)  # the whole mesh, where its owner is here
        extent = om.mesh.extent if om is not None else self.shape.extent
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

    def encode(
        self, m: Method, args: tuple[Any, ...], kwargs: dict[str, Any], targets: Any = None
    ) -> Any:
        """Pickle the arguments for ``targets`` (all the mesh's actors when ``None``).

        Arguments handed off on the receiving procs (distributed tensors, see
        ``handoff``) are announced to their provider here, which may refuse.
        """
        if codec.small_plain((args, kwargs)):
            # Atoms only: nothing in them can be handed off, no capture needed.
            payload = encode_args(m.prop, args, kwargs)
            self.check_usable()
            return payload
        with handoff.capture() as cap:
            payload = encode_args(m.prop, args, kwargs)
        self.check_usable()
        if cap.refs:
            actors = tuple((r, p) for _, r, p in (self.targets() if targets is None else targets))
            payload = cap.wrap(
                self.node, payload, handoff.Recipients(self.ref.mesh_id, m.what, actors)
            )
        return payload

    def _refuse_broadcast(self, m: Method, rank: int, reason: Any) -> SupervisionError:
        name = self.ref.name
        return SupervisionError(
            f"cannot broadcast {m.what}: actor {name}[{rank}] has failed: {reason}; slice "
            "the mesh to its healthy ranks",
            actor=f"{name}[{rank}]",
            reason=str(reason),
        )

    # -- what each route does its own way ----------------------------------------------

    def send(
        self, m: Method, payload: Any, targets: list[Target] | None, collector: Any,
        *, to_failed: bool = False,
    ) -> None:  # fmt: skip
        raise NotImplementedError

    def collector(self, m: Method, n: int, on_value: Any) -> Collector:
        raise NotImplementedError

    def call(self, m: Method, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Future[Any]:
        raise NotImplementedError

    def stop(self, ranks: list[int], reason: str, tick: Callable[..., None], what: str) -> None:
        raise NotImplementedError

    # -- the adverbs -------------------------------------------------------------------

    def call_one(self, m: Method, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Future[Any]:
        targets = self.targets() if self._targets is None else self._targets
        if len(targets) != 1:
            raise ValueError(
                f"call_one requires exactly 1 actor, but mesh {self.ref.name!r} has "
                f"{len(targets)}; slice it first (e.g. mesh.slice(gpus=0)) or use call()"
            )
        return self.one(m, list(targets), args, kwargs)

    def one(
        self, m: Method, targets: list[Target], args: Any, kwargs: Any, payload: Any = None
    ) -> Future[Any]:
        """Call the one actor of ``targets``."""
        if payload is None:
            payload = self.encode(m, args, kwargs, targets)
        cf: concurrent.futures.Future[Any] = concurrent.futures.Future()
        collector = self.collector(m, 1, lambda i, ok, v: set_future(cf, ok, v))
        self.send(m, payload, targets, collector)
        return Future._create(cf, m.what)

    def choose(self, m: Method, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Future[Any]:
        targets = self.targets()
        if not targets:
            raise ValueError(f"choose() on the empty mesh {self.ref.name!r}")
        # The chosen actor sees its own position in the mesh as its message rank.
        return self.one(m, [random.choice(targets)], args, kwargs)

    def stream(
        self, m: Method, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Iterator[Future[Any]]:
        targets = self.targets()
        payload = self.encode(m, args, kwargs, targets)
        cfs: list[concurrent.futures.Future[Any]] = [concurrent.futures.Future() for _ in targets]
        arrived = [0]

        def on_value(index: int, ok: bool, value: Any) -> None:
            k = arrived[0]
            arrived[0] += 1
            set_future(cfs[k], ok, value)

        if targets:
            self.send(m, payload, targets, self.collector(m, len(targets), on_value))
        return iter([Future._create(cf, m.what) for cf in cfs])

    def broadcast(self, m: Method, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.send(m, self.encode(m, args, kwargs), None if self.tree else self.targets(), None)

    def returning(
        self, m: Method, args: tuple[Any, ...], kwargs: dict[str, Any], hand_off: Any
    ) -> None:
        """Send to every actor with no reply port; the outcome of each call goes to the
        producers on its proc, which ``hand_off(key, count, refs, recipients)`` sets up
        (it may raise, before anything is sent). See ``handoff``."""
        targets = self.targets()
        with handoff.capture() as cap:
            payload = encode_args(m.prop, args, kwargs)
        self.check_usable()
        actors = tuple((r, p) for _, r, p in targets)
        recipients = handoff.Recipients(self.ref.mesh_id, m.what, actors)
        payload = cap.wrap(self.node, payload, recipients, hand_off=hand_off)
        self.send(m, payload, targets, None, to_failed=True)

    def to_port(
        self,
        m: Method,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        port: Port[Any] | None,
        selection: str,
    ) -> None:
        """The primitive under the adverbs: replies (one per actor) go to ``port``."""
        targets = self.targets()
        if selection == "choose":
            targets = [random.choice(targets)] if targets else []
        elif selection != "all":
            raise ValueError(f"selection must be 'all' or 'choose', got {selection!r}")
        payload = self.encode(m, args, kwargs, targets)
        sink = None if port is None else PortSink(port, self.rt)
        self.send(m, payload, targets, sink)


class DirectRoute(Route):
    """One ``CALL`` frame per actor, written from the caller's thread."""

    def call_one(self, m: Method, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Future[Any]:
        targets = self._targets
        if targets is None and self.fixed:
            self.targets()  # computed on the first call, then kept
            targets = self._targets
        if targets is None or len(targets) != 1:
            return super().call_one(m, args, kwargs)
        rt = self.rt
        state = self.state
        if rt.tracer is not None or state.failed or state.stopped:
            return self.one(m, list(targets), args, kwargs)
        payload = (args, kwargs)
        bufs: Any = ()
        if not codec.small_plain(payload):
            # Arrays and tensors among the arguments travel as out-of-band buffers, on
            # this light path too: its waiter reads the reply itself (no thread hop).
            body, bufs = self.encode(m, args, kwargs)
        else:  # plain atoms (the common case): no hand-off capture, pickled by the C pickler
            if kwargs or len(args) != m.arity:  # else the arguments fit the signature
                m.prop.bind(args, kwargs)
            body = pickle.dumps(payload, protocol=5)
        # A light port and future, and the header's pickle cached per endpoint.
        index, rank, proc = targets[0]
        sender, chain = sender_of(self._root or self._find_root())
        fut = Pending()
        call = OneCall(rt, m.what, proc, f"{self.ref.name}[{rank}]", fut)
        header = self.headers.call(m, rank, index, call.port, sender, chain)
        rt.send(proc, header, body, bufs, call.fail, pickled=m.pickled(rt.proc_id, header))
        # Its waiter may read the reply itself, off the connection to the actor's proc:
        # looked up again only once that connection has closed (or there was none).
        reader = self._reader
        if reader is None or reader.closed:
            reader = self._reader = rt.reader_for(proc)
        fut.reader = reader
        fut.runtime = rt
        return Future._create(fut, m.what)

    def collector(self, m: Method, n: int, on_value: Any) -> Collector:
        return Collector(self.rt, m.what, n, on_value, lazy=True)

    def call(self, m: Method, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Future[Any]:
        targets = self.targets()
        payload = self.encode(m, args, kwargs, targets)
        fut = Pending()
        values: list[Any] = [None] * len(targets)
        shape = self.shape
        # Replies arrive on the I/O thread, failures to send on the caller's: count
        # safely. A Pending, not a concurrent future: no Condition made per call.
        countdown = Countdown(
            len(targets), lambda: set_future(fut, True, _value_mesh(shape, values))
        )
        if not targets:
            return Future._create(fut, m.what)

        def on_value(index: int, ok: bool, value: Any) -> None:
            if not ok:
                set_future(fut, False, value)
                return
            values[index] = value
            countdown.tick()

        self.send(m, payload, targets, self.collector(m, len(targets), on_value))
        fut.runtime = self.rt
        return Future._create(fut, m.what)

    def send(
        self, m: Method, payload: Any, targets: list[Target] | None, collector: Any,
        *, to_failed: bool = False,
    ) -> None:  # fmt: skip
        """Send ``payload`` to ``targets``. A broadcast (no ``collector``) to a rank known
        to have failed raises ``SupervisionError``, unless ``to_failed``: a hand-off
        whose results are already promised goes to every rank, and a failed actor's
        proc fails its part of the results (whether or not we knew in time)."""
        if targets is None:
            targets = self.targets()
        body, bufs = payload
        if collector is None and bufs:
            # A broadcast has no completion to wait for before reusing the arrays:
            # send a snapshot of them.
            bufs = [bytes(flat(b)) for b in bufs]
        rt = self.rt
        if collector is not None:
            sender, chain = self._sender()
        else:
            sender, chain = self._sender()[0], ()
        port = collector.port if collector is not None else None
        known = self.state.failed  # rank -> why, of the actors known to have failed
        failed = (
            [(i, r, known[r]) for i, r, _ in targets if r in known]
            if known and not to_failed
            else []
        )
        if failed and collector is None:
            raise self._refuse_broadcast(m, failed[0][1], failed[0][2])
        skip = {i for i, _, _ in failed}
        name = self.ref.name
        if collector is not None:
            for index, rank, reason in failed:
                collector.fail_supervision(index, self.failure(rank, reason))
            collector.expect_all(
                [(i, proc, f"{name}[{rank}]") for i, rank, proc in targets if i not in skip]
            )
        tracer = rt.tracer
        t0 = tracer.now() if tracer is not None else 0
        headers = self.headers
        if collector is None:  # a bounce goes back to its sender, on the mesh's node
            bounce = functools.partial(return_to_sender, self.node)
        for index, rank, proc in targets:
            if index in skip:
                continue
            header = headers.call(m, rank, index, port, sender, chain)
            on_fail = (
                functools.partial(collector.fail, index)
                if collector is not None
                else functools.partial(bounce, sender, f"{name}[{rank}].{m.name}()")
            )
            pickled = None if bufs else m.pickled(rt.proc_id, header)
            rt.send(proc, header, body, bufs, on_fail, pickled=pickled)
        if tracer is not None:
            flows = (
                tuple(f"c:{port.proc.name}:{port.port}:{i}" for i, _, _ in targets if i not in skip)
                if port is not None
                else None
            )
            args = {"mesh": name, "actors": len(targets), "bytes": len(body)}
            tracer.span(f"send {m.what}", "send", t0, args, flow_out=flows)

    def stop(self, ranks: list[int], reason: str, tick: Callable[..., None], what: str) -> None:
        rt = self.rt
        procs = self.ref.procs
        collector = Collector(rt, what, len(ranks), tick, lost_is_ok=True)
        for index, rank in enumerate(ranks):
            collector.expect(index, procs[rank])
        for index, rank in enumerate(ranks):
            rt.send(
                procs[rank],
                StopActor(self.ref.mesh_id, rank, collector.port, index, reason),
                on_fail=functools.partial(collector.fail, index),
            )


class TreeRoute(Route):
    """One ``CAST`` down the mesh's cast tree; ``call()`` gathers the replies up it,
    other adverbs have each reply come straight back."""

    tree = True

    def _await_boot(self) -> None:
        """Before the first cast down the tree: wait until every proc of the mesh has booted.

        The procs of the tree connect to each other; one that is still booting has
        no socket yet, and a forwarder that cannot connect declares it lost. The
        client that spawned the procs knows when each is up (a mesh received
        from elsewhere was pickled after its procs were up). Blocks only while
        procs are still booting, bounded as ``wait_ready``.
        """
        state = self.state
        if state.booted:
            return
        wait_ready(self.rt, self.ref.procs)
        state.booted = True

    def _known_failed(self, selection: Selection) -> list[tuple[int, int, str]]:
        """``(slot, rank, why)`` of the selected actors known to have failed."""
        failed = self.state.failed
        if not failed:
            return []
        return [(selection.slot(r), r, why) for r, why in list(failed.items()) if r in selection]

    def collector(self, m: Method, n: int, on_value: Any) -> Collector:
        return TreeCollector(
            self.rt,
            m.what,
            n,
            on_value,
            mesh_size=len(self.ref.procs),
            fanout=config.values.tree_fanout,
            lazy=True,
        )

    def send(
        self, m: Method, payload: Any, targets: list[Target] | None, collector: Any,
        *, to_failed: bool = False,
    ) -> None:  # fmt: skip
        """Send down the cast tree; replies (if any) come straight back to ``collector``
        (``to_failed``: as in ``DirectRoute.send``)."""
        self._await_boot()
        body, bufs = payload
        if collector is None and bufs:
            bufs = [bytes(flat(b)) for b in bufs]  # nothing tells a broadcast's caller when
        procs = self.ref.procs
        if targets is None or len(targets) == len(self.shape):
            selection = Selection.of(self.shape.ndslice)
        else:
            order = sorted(targets, key=lambda t: t[1])
            selection = Selection._listed(tuple(t[1] for t in order), tuple(t[0] for t in order))
        failed = [] if to_failed else self._known_failed(selection)
        name = self.ref.name
        if failed and collector is None:
            raise self._refuse_broadcast(m, failed[0][1], failed[0][2])
        port = collector.port if collector is not None else None
        sender, chain = self._sender()
        header = self.headers.cast(
            m.name, m.flags, False, port, selection, sender, chain if port is not None else ()
        )
        on_fail: Callable[[int, int, str], None]
        if isinstance(collector, TreeCollector):
            assert targets is not None
            for slot, rank, why in failed:
                collector.fail_supervision(slot, self.failure(rank, why))
            collector.expect_all([(i, proc, f"{name}[{rank}]") for i, rank, proc in targets])
            collector.expect_tree(targets, procs, ancestors=len(targets) < len(procs))
            tc = collector

            def on_fail(slot: int, rank: int, why: str) -> None:
                tc.fail(slot, why)

        elif collector is not None:  # a user's port: as the direct path, nothing is watched
            sink = collector

            def on_fail(slot: int, rank: int, why: str) -> None:
                sink.fail(slot, why)

        else:
            node = self.node

            def on_fail(slot: int, rank: int, why: str) -> None:
                return_to_sender(node, header.sender, f"{name}[{rank}].{m.name}()", why)

        self.rt.tree.cast(procs, selection, header, body, bufs, on_fail=on_fail)

    def call(self, m: Method, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Future[Any]:
        """``call()`` through the tree, replies gathered one message per subtree."""
        payload = self.encode(m, args, kwargs)
        shape = self.shape
        n = len(shape)
        cf: concurrent.futures.Future[Any] = concurrent.futures.Future()
        if n == 0:
            cf.set_result(ValueMesh(shape, []))
            return Future._create(cf, m.what)
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
        rt = self.rt
        selection = Selection.of(shape.ndslice)
        name = self.ref.name
        collector = GatherCollector(rt, m.what, name, n, selection, on_value, on_values)
        for slot, rank, why in self._known_failed(selection):
            collector.fail_supervision(slot, f"actor {name}[{rank}] has failed: {why}")
        sender, chain = self._sender()
        header = self.headers.cast(m.name, m.flags, True, None, selection, sender, chain)
        rt.tree.cast(self.ref.procs, selection, header, *payload, root=collector.root)
        return Future._create(cf, m.what)

    def stop(self, ranks: list[int], reason: str, tick: Callable[..., None], what: str) -> None:
        """Stop a mesh messaged through its cast tree: the stop follows, on every path,
        whatever this proc sent to it before (a broadcast is handled, then the stop)."""
        procs = self.ref.procs
        collector = TreeCollector(
            self.rt,
            what,
            len(ranks),
            tick,
            mesh_size=len(procs),
            fanout=config.values.tree_fanout,
            lost_is_ok=True,
        )
        targets = [(i, r, procs[r]) for i, r in enumerate(ranks)]
        for index, _, proc in targets:
            collector.expect(index, proc)
        collector.expect_tree(targets, procs, ancestors=len(ranks) < len(procs))
        selection = Selection.of(self.shape.ndslice)
        header = self.headers.cast(
            reason, FLAG_STOP, False, collector.port, selection, None, (), traced=False
        )
        self.rt.tree.cast(
            procs, selection, header, b"", (), on_fail=lambda s, r, why: collector.fail(s, why)
        )
