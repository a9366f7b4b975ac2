"""The gather ports of the cast tree: each waits for its subtrees' GATHERs (and maybe
its own actor's reply) and passes the replies on, up to the parent (a node's) or to
the caller (the root's, `RootGather`).

A gather calls only what `GatherCalls` holds (open a port, watch a proc, send),
which the runtime hands the tree router; the router hands itself as the
`GatherRouter` holding those calls and the counters.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..._errors import SupervisionError
from ..._mesh.tree import Selection
from ..._wire import codec
from ..._wire.frame import flat
from ..._wire.ids import PortId, ProcId
from ..._wire.protocol import STATUS_ERROR, STATUS_OK, Cast, Gather, Message
from .gather_body import Entry, encode_entries

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

__all__ = ["GatherBase", "GatherCalls", "GatherRouter", "NodeGather", "RootGather"]


@dataclass(frozen=True, slots=True)
class GatherCalls:
    """What a gather calls: the router's ports, the peers' loss watch, the sender."""

    open_port: Callable[[Any], PortId]
    close_port: Callable[[int], None]
    watch: Callable[[ProcId, int], str | None]  # returns the reason if lost already
    unwatch: Callable[[Iterable[str], int], None]
    send: Callable[..., None]


class _GatherStats(Protocol):
    gathers_out: int


class GatherRouter(Protocol):
    """What a gather needs of the tree router: the calls it hands on and the counters."""

    @property
    def gather(self) -> GatherCalls: ...

    @property
    def stats(self) -> _GatherStats: ...


class GatherBase:
    """A port that waits for a set of subtrees (one GATHER each) and maybe a local reply.

    Subclasses say what to do with entries (``_take``) and when all are in
    (``_finish``). Entries and losses may arrive on any thread.
    """

    def __init__(self, router: GatherRouter, selection: Selection, expected: int) -> None:
        self.router = router
        self.calls = router.gather
        self.selection = selection
        self.expected = expected  # answers still due: subtrees, plus the local reply
        self._children: dict[int, tuple[int, str]] = {}  # child lo -> (hi, proc name)
        self._names: dict[str, int] = {}  # proc name -> child lo
        self._watched: list[str] = []
        # Guards the gather's progress: the children due, expected, _armed, _done, and
        # the entries, slots and values a node gather buffers.
        self._lock = threading.Lock()
        self._armed = False
        self._done = False
        self.port: PortId | None = self.calls.open_port(self)

    def expect_child(self, lo: int, hi: int, proc: ProcId) -> str | None:
        """Wait for subtree ``[lo, hi)`` of ``proc``; returns why if ``proc`` is lost already."""
        assert self.port is not None
        reason = self.calls.watch(proc, self.port.port)
        if reason is not None:
            return reason
        with self._lock:
            self._children[lo] = (hi, proc.name)
            self._names[proc.name] = lo
            self._watched.append(proc.name)
            self.expected += 1
        return None

    def forget_child(self, lo: int) -> None:
        """Subtree ``lo`` was not sent after all (it is routed around instead)."""
        with self._lock:
            entry = self._children.pop(lo, None)
            if entry is not None:
                self._names.pop(entry[1], None)
        if entry is not None:
            self._count_and_finish()

    def fail_ranks(self, header: Cast, ranks: Sequence[tuple[int, int]], why: str) -> None:
        """Answer ``ranks`` (slot, rank) with a ``SupervisionError``: they were not reached."""
        entries: list[Entry] = [
            (slot, STATUS_ERROR, _error_body(header, rank, why), ()) for slot, rank in ranks
        ]
        self._take(entries, (), (), final=False)

    def deliver_gather(
        self, child: int, entries: list[Entry], slots: Sequence[int], values: Sequence[Any]
    ) -> None:
        with self._lock:
            entry = self._children.pop(child, None)
            if entry is None:
                return  # already failed (its proc was declared lost first)
            self._names.pop(entry[1], None)
        self._take(entries, slots, values, final=True)

    def deliver(self, frame: Message) -> None:
        """A plain REPLY to this port (e.g. an undeliverable call answered by a runtime)."""
        h = frame.header
        self._take([(h.slot, h.status, bytes(frame.body), list(frame.buffers))], (), (), final=True)

    def local_reply(
        self, slot: int, status: int, body: bytes | memoryview, buffers: Sequence[ReadableBuffer]
    ) -> None:
        """The reply of this proc's own actor (any thread; its arrays are copied)."""
        if status == STATUS_OK and not buffers:
            try:
                value = codec.loads(body)
            except Exception:  # the caller will say it cannot be unpickled
                pass
            else:
                self._take([], (slot,), (value,), final=True)
                return
        self._take([(slot, status, body, [bytes(flat(b)) for b in buffers])], (), (), final=True)

    def peer_lost(self, name: str, reason: str) -> None:
        with self._lock:
            lo = self._names.pop(name, None)
            entry = self._children.pop(lo, None) if lo is not None else None
        if entry is None or lo is None:
            return
        hi = entry[0]
        why = (
            f"proc {name}, which forwards this message to ranks {lo}..{hi - 1}, was lost "
            f"before they answered: {reason}"
        )
        self._lost(lo, hi, why)

    def armed(self) -> None:
        """Everything expected has been sent: finish now if all answers are in already."""
        with self._lock:
            self._armed = True
            last = self.expected <= 0 and not self._done
            self._done = self._done or last
        if last:
            self._close()
            self._finish()

    def _count_and_finish(self) -> None:
        if self._count(True):
            self._finish()

    def _count(self, final: bool) -> bool:
        """Count one answer (if ``final``); True if that was the last one."""
        with self._lock:
            if final:
                self.expected -= 1
            last = self._armed and self.expected <= 0 and not self._done
            self._done = self._done or last
        if last:
            self._close()
        return last

    def _close(self) -> None:
        if self.port is not None:
            self.calls.close_port(self.port.port)
            self.calls.unwatch(self._watched, self.port.port)

    def _lost(self, lo: int, hi: int, why: str) -> None:
        raise NotImplementedError

    def _take(
        self, entries: list[Entry], slots: Sequence[int], values: Sequence[Any], final: bool
    ) -> None:
        raise NotImplementedError

    def _finish(self) -> None:
        raise NotImplementedError


class NodeGather(GatherBase):
    """A proc's gather port: collects its subtree's replies, sends one GATHER up."""

    def __init__(self, router: GatherRouter, header: Cast, selection: Selection, expected: int):
        super().__init__(router, selection, expected)
        self.header = header
        self.entries: list[Entry] = []
        self.slots: list[int] = []
        self.values: list[Any] = []

    def _take(
        self, entries: list[Entry], slots: Sequence[int], values: Sequence[Any], final: bool
    ) -> None:
        with self._lock:
            self.entries.extend(entries)
            self.slots.extend(slots)
            self.values.extend(values)
        if self._count(final):
            self._finish()

    def _lost(self, lo: int, hi: int, why: str) -> None:
        h = self.header
        entries: list[Entry] = [
            (slot, STATUS_ERROR, _error_body(h, rank, why), ())
            for slot, rank in self.selection.ranks_in(lo, hi)
        ]
        self._take(entries, (), (), final=True)

    def _finish(self) -> None:
        h = self.header
        assert h.port is not None
        with self._lock:
            entries, self.entries = self.entries, []
            slots, self.slots = self.slots, []
            values, self.values = self.values, []
        body, bufs = encode_entries(entries, slots, values)
        self.router.stats.gathers_out += 1
        count = len(entries) + len(slots)
        # If the parent is gone, its own parent fails this subtree: nothing to do here.
        self.calls.send(h.port.proc, Gather(h.port.port, h.lo, count), body, bufs, _ignore)


class RootGather(GatherBase):
    """The caller's gather port for one gathered cast.

    ``on_values(slots, values)`` runs for replies that arrive as plain values,
    ``on_entry(slot, status, body, buffers)`` for each other reply (the body
    is a pickled value as a REPLY carries it), ``on_lost(slot, rank, why)``
    for each rank lost with a subtree. Any may run on the I/O thread or the
    caller's.
    """

    def __init__(
        self,
        router: GatherRouter,
        selection: Selection,
        on_entry: Callable[[int, int, Any, Sequence[Any]], None],
        on_lost: Callable[[int, int, str], None],
        on_values: Callable[[Sequence[int], Sequence[Any]], None],
    ) -> None:
        super().__init__(router, selection, 0)
        self.on_entry = on_entry
        self.on_lost = on_lost
        self.on_values = on_values

    def fail_ranks(self, header: Cast, ranks: Sequence[tuple[int, int]], why: str) -> None:
        for slot, rank in ranks:
            self.on_lost(slot, rank, why)

    def _take(
        self, entries: list[Entry], slots: Sequence[int], values: Sequence[Any], final: bool
    ) -> None:
        if slots:
            self.on_values(slots, values)
        for slot, status, body, bufs in entries:
            self.on_entry(slot, status, body, bufs)
        if self._count(final):
            self._finish()

    def _lost(self, lo: int, hi: int, why: str) -> None:
        for slot, rank in self.selection.ranks_in(lo, hi):
            self.on_lost(slot, rank, why)
        self._count_and_finish()

    def _finish(self) -> None:
        pass


def _error_body(header: Cast, rank: int, why: str) -> bytes:
    err = SupervisionError(
        f"actor {header.name}[{rank}] was not reached: {why}",
        actor=f"{header.name}[{rank}]",
        reason=why,
    )
    body, _ = codec.dumps(err)
    return bytes(flat(body))


def _ignore(reason: str) -> None:
    pass
