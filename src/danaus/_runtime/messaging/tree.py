"""The cast tree: one frame per subtree down, one combined reply per subtree up.

A message to many actors of a large mesh leaves the sender as at most
``fanout`` CAST frames, one per subtree of the mesh's cast tree
(``danaus._mesh.tree``); the proc at the top of each subtree delivers it to
its own actor (if selected) and forwards it to its own subtrees, so every
proc receives each message exactly once and the sender's work grows with
the fan-out, not with the mesh:

    sender --CAST [0,512)--> p0 --CAST [1,33)--> p1 --CAST [2,4)--> p2 ...
           --CAST [512,1024)--> p512 ...
    (gather)  p2 --GATHER--> p1 --GATHER--> p0 --GATHER--> sender

With ``gather`` (``call()``), each proc opens a gather port, waits for its
own actor's reply and one GATHER from each subtree it forwarded to, and
sends one GATHER (all the replies of its subtree) to its parent. Plain
values (no out-of-band buffers) are unpickled on the way and travel up as one
pickled list per subtree, so the caller unpickles ``fanout`` lists instead of
one reply per actor; errors and values with large buffers travel as they
came. Without
(``stream()``, ports, ``call_one``), replies go straight to the caller's port,
so each arrives as soon as its actor answers.

Routes: the tree is fixed by the mesh's size and the fan-out, so a proc
needs the procs of its own subtree. The sender's first cast to a mesh
carries them (each hop passes on the part below it) and is not pruned, so
every proc learns its routes; later casts carry none and go only into
subtrees holding a selected rank. Procs keep routes for the
``tree_route_meshes`` most recently used meshes.

Failure: a subtree whose proc cannot be reached at send time (lost, or its
connection refused) is routed around: its rank fails and its own subtrees
are sent to directly, so a dead proc costs exactly its own rank. A proc that
dies after it took a message (mid-cast) fails exactly the ranks of its
subtree that had not answered: its parent watches it. Nothing waits for a
proc that is gone.
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ... import _config as config
from ..._errors import SupervisionError
from ..._mesh.tree import Selection, node_children, root_children
from ..._wire.frame import flat
from ..._wire.ids import ProcId
from ..._wire.protocol import STATUS_ERROR, STATUS_OK, Call, Cast, Kind, Message, StopActor
from .faces import TreeCalls
from .gather_body import decode_entries, encode_entries
from .gathers import GatherBase, NodeGather, RootGather

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

    from ..._transport.conn import Connection

# RootGather, encode_entries and decode_entries live in gathers and gather_body; named
# here too, where their callers found them.
__all__ = ["RootGather", "TreeRouter", "TreeStats", "decode_entries", "encode_entries"]

log = logging.getLogger("danaus.runtime")

# A CAST flag: stop the actors (``method`` holds the reason) instead of calling them, so
# a mesh's stop travels the same path as the messages sent to it before, and follows them.
FLAG_STOP = 1 << 8


class TreeStats:
    """Counters of one proc's cast tree traffic (read by tests and benchmarks)."""

    __slots__ = ("casts", "forwarded", "gathers_in", "gathers_out", "max_hops", "rerouted")

    def __init__(self) -> None:
        self.casts = 0  # CAST frames received
        self.forwarded = 0  # CAST frames sent (as sender or forwarder)
        self.gathers_in = 0
        self.gathers_out = 0
        self.max_hops = 0
        self.rerouted = 0  # subtrees sent to past an unreachable proc


class Subtree:
    """What this proc sends one message into: the part of the tree below it.

    Its ranks are ``[base, base + len(table))`` and ``table[r - base]`` is rank
    ``r``'s proc (the whole mesh at the sender, the ranks of its own subtree at a
    proc of the tree). It travels with the message (``selection``, ``header``
    without its subtree fields, ``body``, ``buffers``) and says where answers and
    failures go: ``parent`` (this proc's gather, if any) or else ``on_fail``.
    One object per message at each proc, shared by the sends into its children,
    so a send, a failed send and a route around pass it instead of 11 arguments.
    """

    __slots__ = ("base", "body", "buffers", "header", "on_fail", "parent", "selection", "table")

    def __init__(
        self,
        table: Sequence[ProcId],
        base: int,
        selection: Selection,
        header: Cast,
        body: bytes | memoryview,
        buffers: Sequence[ReadableBuffer],
        parent: GatherBase | None,
        on_fail: Callable[[int, int, str], None] | None,
    ) -> None:
        self.table = table
        self.base = base
        self.selection = selection
        self.header = header
        self.body = body
        self.buffers = buffers
        self.parent = parent
        self.on_fail = on_fail

    def with_buffers(self, buffers: Sequence[Any]) -> Subtree:
        """The same, carrying ``buffers`` instead."""
        return Subtree(
            self.table,
            self.base,
            self.selection,
            self.header,
            self.body,
            buffers,
            self.parent,
            self.on_fail,
        )


class TreeRouter:
    """The cast tree side of one runtime: sends casts, forwards them, gathers replies."""

    def __init__(self, calls: TreeCalls) -> None:
        self.calls = calls
        self.gather = calls.gather  # what its gathers call (gathers.GatherRouter)
        self.stats = TreeStats()
        # (mesh, lo, hi) -> procs of ranks [lo, hi): this proc's subtrees (I/O thread)
        self._routes: collections.OrderedDict[tuple[str, int, int], tuple[ProcId, ...]] = (
            collections.OrderedDict()
        )
        self._installed: collections.OrderedDict[tuple[str, int], None] = collections.OrderedDict()
        self._modes: collections.OrderedDict[str, bool] = collections.OrderedDict()
        self._selections: dict[tuple[Any, ...], Selection] = {}
        # Guards the routes installed and the tree modes decided (_installed, _modes):
        # numbering, route installation and the sends of one cast are atomic, so
        # casts from several threads of this proc leave in one order on every path.
        self._lock = threading.RLock()
        calls.register(Kind.CAST, self._on_cast)
        calls.register(Kind.GATHER, self._on_gather)

    # -- the sender ------------------------------------------------------------

    def use_tree(self, mesh: str, procs: Sequence[ProcId]) -> bool:
        """Whether messages from this proc to mesh ``mesh`` go through its cast tree.

        Decided on first use and kept (for the ``tree_route_meshes`` most recent
        meshes), so a later change of ``tree_min_ranks`` cannot send one mesh's
        messages down two paths: a large mesh with one actor per proc uses it.
        """
        decided = self._modes.get(mesh)
        if decided is not None:
            return decided
        with self._lock:
            decided = self._modes.get(mesh)
            if decided is None:
                decided = len(procs) >= max(2, config.get("tree_min_ranks")) and len(
                    {p.name for p in procs}
                ) == len(procs)
                self._modes[mesh] = decided
                while len(self._modes) > config.get("tree_route_meshes"):
                    self._modes.popitem(last=False)
        return decided

    def cast(
        self,
        procs: Sequence[ProcId],
        selection: Selection,
        header: Cast,
        body: bytes | memoryview,
        buffers: Sequence[ReadableBuffer],
        *,
        root: RootGather | None = None,
        on_fail: Callable[[int, int, str], None] | None = None,
    ) -> None:
        """Send a message down the tree of the mesh whose rank ``r`` lives on ``procs[r]``.

        ``header`` is the CAST header without its subtree fields (they are
        filled in per subtree). ``root`` receives the GATHERs of a gathered
        call; ``on_fail(slot, rank, reason)`` hears of each selected rank that
        could not be reached at send time (replies of the others are unaffected).
        """
        n = len(procs)
        fanout = header.fanout
        if fanout < 2:
            raise ValueError(f"tree_fanout must be at least 2, got {fanout!r}")
        with self._lock:
            key = (header.mesh, fanout)
            install = key not in self._installed
            if install:
                self._installed[key] = None
                while len(self._installed) > config.get("tree_route_meshes"):
                    self._installed.popitem(last=False)
            else:
                self._installed.move_to_end(key)
            tree = Subtree(procs, 0, selection, header, body, buffers, root, on_fail)
            for lo, hi in root_children(n, fanout):
                if not install and not selection.count_in(lo, hi):
                    continue
                self._send_subtree(tree, lo, hi, install)
        if root is not None:
            root.armed()

    def _send_subtree(self, tree: Subtree, lo: int, hi: int, install: bool) -> None:
        """Send child subtree ``[lo, hi)`` of ``tree`` to its proc (``tree.table[lo -
        tree.base]``), with the routes below it if ``install``, or past that proc if it
        is known to be unreachable."""
        base = tree.base
        proc = tree.table[lo - base]
        parent = tree.parent
        lost = self.calls.is_lost(proc.name)
        if lost is None and parent is not None:
            lost = parent.expect_child(lo, hi, proc)
        if lost is not None:
            self._route_around(tree, lo, hi, lost)
            return
        h = tree.header
        routes = None
        if install:
            # Routes are dialled by other procs, which know only what they say: each
            # proc's freshest address here (one on another host reports its TCP port in
            # its READY; the mesh holds the address its spawner first gave it).
            routes = tuple(self.calls.resolve(p) for p in tree.table[lo - base : hi - base])
        sub = Cast(
            h.mesh,
            h.name,
            h.method,
            parent.port if parent is not None else h.port,
            h.gather,
            h.selection,
            lo,
            hi,
            h.fanout,
            routes,
            h.labels,
            h.sizes,
            h.sender,
            h.chain,
            h.flags,
            h.hops + 1,
            h.trace,
        )
        self.stats.forwarded += 1
        self.calls.send(
            proc,
            sub,
            tree.body,
            tree.buffers,
            functools.partial(self._send_failed, tree, lo, hi),
        )

    def _send_failed(self, tree: Subtree, lo: int, hi: int, reason: str) -> None:
        """The frame for ``[lo, hi)`` never left: its proc did not get it, so route around."""
        if tree.parent is not None:
            tree.parent.forget_child(lo)
        # Its buffers may be the caller's arrays, reused by now: take a snapshot.
        tree = tree.with_buffers([bytes(flat(b)) for b in tree.buffers])
        self._route_around(tree, lo, hi, reason)

    def _route_around(self, tree: Subtree, lo: int, hi: int, reason: str) -> None:
        """Rank ``lo`` is unreachable: it fails; its subtrees are sent to from here."""
        self.stats.rerouted += 1
        why = f"its proc {tree.table[lo - tree.base].name} is unreachable: {reason}"
        selection, header = tree.selection, tree.header
        if lo in selection:
            slot = selection.slot(lo)
            if tree.parent is not None:
                tree.parent.fail_ranks(header, [(slot, lo)], why)
            elif tree.on_fail is not None:
                tree.on_fail(slot, lo, why)
            else:
                self._unreachable(header, [(slot, lo)], why)
        for a, b in node_children(lo, hi, header.fanout):
            if selection.count_in(a, b):
                # Always with routes: the procs below may never have had them.
                self._send_subtree(tree, a, b, True)

    def _unreachable(self, header: Cast, ranks: list[tuple[int, int]], why: str) -> None:
        """Tell whoever waits for ``ranks`` (slot, rank) that they were not reached."""
        if header.port is not None:
            for slot, rank in ranks:
                err = SupervisionError(
                    f"actor {header.name}[{rank}] was not reached: {why}",
                    actor=f"{header.name}[{rank}]",
                    reason=why,
                )
                self.calls.reply(header.port, slot, STATUS_ERROR, err)
        elif header.sender is not None:
            for _, rank in ranks:
                self.calls.bounce(header.sender, f"{header.name}[{rank}].{header.method}()", why)
        else:
            log.error(
                "a broadcast of %s.%s() did not reach %d actors: %s",
                header.name,
                header.method,
                len(ranks),
                why,
            )

    # -- a proc of the tree ----------------------------------------------------

    def _selection(self, wire: tuple[Any, ...]) -> Selection:
        """The selection a CAST names (the same few recur: decoded once)."""
        sel = self._selections.get(wire)
        if sel is None:
            sel = Selection.from_wire(wire)
            if len(self._selections) >= 256:
                self._selections.clear()
            self._selections[wire] = sel
        return sel

    def _on_cast(self, conn: Connection, msg: Message) -> None:
        h: Cast = msg.header
        stats = self.stats
        stats.casts += 1
        if h.hops > stats.max_hops:
            stats.max_hops = h.hops
        lo, hi = h.lo, h.hi
        try:
            selection = self._selection(h.selection)
            if h.fanout < 2 or not 0 <= lo < hi:
                raise ValueError(f"bad subtree [{lo}, {hi}) or fan-out {h.fanout}")
            if h.table is not None and len(h.table) != hi - lo:
                raise ValueError(f"{len(h.table)} routes for subtree [{lo}, {hi})")
        except (ValueError, TypeError) as e:
            log.error("dropping a malformed CAST from %s: %s", conn.peer, e)
            conn.fail_now(f"protocol error: malformed CAST: {e}")
            return
        key = (h.mesh, lo, hi)
        table: tuple[ProcId, ...] | None = h.table
        install = table is not None
        if table is not None:
            self._routes[key] = table
            self._routes.move_to_end(key)
            while len(self._routes) > config.get("tree_route_meshes"):
                self._routes.popitem(last=False)
        else:
            table = self._routes.get(key)
            if table is not None:
                self._routes.move_to_end(key)
        # Selected ranks below each boundary: lo, then each subtree's start, then hi.
        kids = node_children(lo, hi, h.fanout)
        below = [selection.count_below(x) for x in (lo, *(a for a, _ in kids), hi)]
        local = below[1] > below[0]
        if not install:
            kids = tuple(k for i, k in enumerate(kids) if below[i + 2] > below[i + 1])
        agg: NodeGather | None = None
        if h.gather and h.port is not None:
            agg = NodeGather(self, h, selection, int(local))
        if table is None:
            if kids:
                why = (
                    f"proc {self.calls.me().name} has no routes for actor mesh {h.name!r} (it "
                    "keeps the tree_route_meshes most recently used meshes; raise that setting)"
                )
                lost = [sr for a, b in kids for sr in selection.ranks_in(a, b)]
                if agg is not None:
                    agg.fail_ranks(h, lost, why)
                else:
                    self._unreachable(h, lost, why)
        elif kids:
            tree = Subtree(table, lo, selection, h, msg.body, msg.buffers, agg, None)
            for a, b in kids:
                self._send_subtree(tree, a, b, install)
        if local and h.flags & FLAG_STOP:
            port = agg.port if agg is not None else h.port
            slot = selection.slot_at(below[0])
            stop = self.calls.handler(Kind.STOP_ACTOR)
            if stop is None or port is None:  # no actor layer here: nothing to stop
                if port is not None:
                    self.calls.reply(port, slot, STATUS_OK, None)
            else:
                stop(
                    conn,
                    Message(
                        Kind.STOP_ACTOR, StopActor(h.mesh, lo, port, slot, h.method), msg.body, []
                    ),
                )
        elif local:
            call = Call(
                h.mesh,
                lo,
                h.method,
                agg.port if agg is not None else h.port,
                selection.slot_at(below[0]),
                h.labels,
                h.sizes,
                h.sender,
                h.chain,
                h.flags,
                h.trace,
            )
            self.calls.deliver_call(Message(Kind.CALL, call, msg.body, msg.buffers), None)
        if agg is not None:
            agg.armed()

    def _on_gather(self, conn: Connection, msg: Message) -> None:
        self.stats.gathers_in += 1
        handler = self.calls.port(msg.header.port)
        deliver = getattr(handler, "deliver_gather", None)
        if deliver is None:
            return  # that gather gave up on this subtree already (its proc was declared lost)
        try:
            entries, slots, values = decode_entries(msg.body, msg.buffers)
        except Exception as e:
            log.error("dropping a malformed GATHER from %s: %s", conn.peer, e)
            conn.fail_now(f"protocol error: malformed GATHER: {e}")
            return
        deliver(msg.header.child, entries, slots, values)
