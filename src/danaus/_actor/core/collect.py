"""Reply collectors: the local ports that turn reply frames into futures.

A collector is opened for one call to ``n`` actors. It watches the procs
those actors live on, so a proc that dies fails exactly the replies it owed
(``SupervisionError``) and nothing waits for it. Collectors run on the I/O
thread and complete ``concurrent.futures.Future`` objects, which the public
`Future` wraps. A user's call gets its replies
as `Undecoded` (``lazy=True``): the I/O thread hands over the frame and
the thread that reads the future unpickles it.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..._errors import ActorError, InternalError, SupervisionError
from ..._mesh import tree
from ..._runtime.messaging.runtime import STATUS_ERROR, STATUS_EXC, STATUS_OK, Runtime
from ..._runtime.messaging.tree import RootGather
from ..._wire import codec
from ..._wire.ids import PortId, ProcId
from ..._wire.protocol import Kind, Message, Reply
from .future import Deferred, Pending

__all__ = [
    "Collector",
    "Countdown",
    "GatherCollector",
    "OneCall",
    "TreeCollector",
    "Undecoded",
    "decode_reply",
    "set_future",
    "wait_ready",
]


def decode_reply(frame: Message, what: str) -> tuple[bool, Any]:
    """``(True, value)`` or ``(False, exception)`` from a REPLY frame."""
    status = frame.header.status
    try:
        payload = codec.loads(frame.body, frame.buffers)
    except Exception as e:
        return False, _unreadable(e, what)
    if status == STATUS_OK:
        return True, payload
    if status == STATUS_EXC:
        if isinstance(payload, tuple) and len(payload) == 2:
            exc, tb = payload
            return False, ActorError(exc, f"Actor call {what} failed.", tb)
        return False, ActorError(payload, f"Actor call {what} failed.")
    if status == STATUS_ERROR:
        if isinstance(payload, SupervisionError):
            return False, SupervisionError(
                f"Actor call {what} failed: {payload}",
                actor=payload.actor,
                reason=payload.reason,
                during=payload.during,
            )
        return False, payload
    return False, InternalError(f"reply with unknown status {status!r}")


def _unreadable(e: Exception, what: str) -> ActorError:
    return ActorError(e, f"The reply of {what} could not be unpickled here.")


class Undecoded(Deferred):
    """A reply frame, unpickled by the first thread that reads it (never the I/O thread).

    ``ok`` comes from the frame's status, known without unpickling; a value
    that fails to unpickle raises ``ActorError`` saying so when read.
    ``port=True``: a message on a user's port, where ``Port.exception(exc)``
    makes the reader raise ``exc`` itself.
    """

    __slots__ = ("_port", "_what", "ok")

    def __init__(self, frame: Message, what: str, port: bool = False) -> None:
        # The frame is the input (no closure for Deferred to call: a function and its
        # cells are objects the garbage collector tracks, one set per reply).
        self._input = frame
        self._what = what
        self._port = port
        self.ok = frame.header.status == STATUS_OK

    def _compute(self, frame: Message) -> Any:
        if self.ok:  # a value (the common case): only unpickled
            try:
                return codec.loads(frame.body, frame.buffers)
            except Exception as e:
                err = _unreadable(e, self._what)
            raise err
        return _decoded(frame, self._what, self._port)


def _decoded(frame: Message, what: str, port: bool) -> Any:
    ok, value = decode_reply(frame, what)
    if ok:
        return value
    if port and frame.header.status == STATUS_EXC and isinstance(value, ActorError):
        value = value.exception  # Port.exception(exc): recv() raises exc itself
    raise value


class Collector:
    """Collects the replies of one message sent to ``n`` destinations.

    ``on_value(index, ok, value)`` is called once per destination (I/O thread
    or the failing sender's thread), then the port closes itself.
    """

    def __init__(
        self,
        rt: Runtime,
        what: str,
        n: int,
        on_value: Callable[[int, bool, Any], None],
        *,
        lost_is_ok: bool = False,
        lazy: bool = False,
    ) -> None:
        self.rt = rt
        self.lazy = lazy  # hand over Undecoded replies (the reader unpickles them)
        self.what = what
        self.pending: dict[int, str] = {}  # index -> proc name
        self.remaining = n
        self.on_value = on_value
        self.lost_is_ok = lost_is_ok
        self._lock = threading.Lock()  # guards pending and remaining
        self.labels: dict[int, str] = {}
        self.watched: set[str] = set()
        self.port: PortId = rt.router.open_port(self)
        tracer = rt.tracer
        self._traced = tracer is not None
        if tracer is not None:  # the span of the whole call, from here to the last reply
            tracer.begin(what, "call", f"{self.port.proc.name}:{self.port.port}", {"actors": n})

    def expect(self, index: int, proc: ProcId, label: str = "") -> None:
        """Expect a reply for ``index`` from ``proc``; fails at once if ``proc`` is lost.

        ``label`` names the actor (``mesh[rank]``) in the error if it is.
        """
        self.expect_all(((index, proc, label),))

    def expect_all(self, expected: Iterable[tuple[int, ProcId, str]]) -> None:
        """`expect` of each ``(index, proc, label)``, their procs watched together."""
        procs = []
        indexes = []
        for index, proc, label in expected:
            if label:
                self.labels[index] = label
            self.pending[index] = proc.name
            self.watched.add(proc.name)
            procs.append(proc)
            indexes.append(index)
        lost = self.rt.peers.watch_all(procs, self.port.port)
        if lost:
            for index, proc in zip(indexes, procs, strict=True):
                if proc.name in lost:
                    self._lost_one(index, proc.name, lost[proc.name])

    def deliver(self, frame: Message) -> None:
        index = frame.header.slot
        with self._lock:
            if self.pending.pop(index, None) is None:
                return  # already failed (its proc was lost), or a duplicate
        if self.lazy:
            lazy = Undecoded(frame, self.what)
            self._done_one(index, lazy.ok, lazy)
            return
        ok, value = decode_reply(frame, self.what)
        self._done_one(index, ok, value)

    def fail(self, index: int, reason: str) -> None:
        """The message for ``index`` could not be sent."""
        name = self.pending.get(index)
        if name is not None:
            self._lost_one(index, name, reason)

    def fail_supervision(self, index: int, why: str) -> None:
        """Resolve ``index`` with ``SupervisionError(why)`` without sending anything."""
        err = SupervisionError(f"Actor call {self.what} failed: {why}", actor=self.what, reason=why)
        self._done_one(index, False, err)

    def peer_lost(self, proc: str, reason: str) -> None:
        for index, name in list(self.pending.items()):
            if name == proc:
                self._lost_one(index, name, reason)

    def _lost_one(self, index: int, proc: str, reason: str) -> None:
        with self._lock:
            if self.pending.pop(index, None) is None:
                return
        if self.lost_is_ok:
            self._done_one(index, True, None)
            return
        label = self.labels.get(index)
        who = f"actor {label}" if label else "the actor"
        err = SupervisionError(
            f"Actor call {self.what} failed: {who} is gone with its proc {proc}: {reason}",
            actor=label or f"{self.what} (proc {proc})",
            reason=reason,
        )
        self._done_one(index, False, err)

    def _done_one(self, index: int, ok: bool, value: Any) -> None:
        with self._lock:
            self.remaining -= 1
            last = self.remaining <= 0
        if last:
            self.rt.router.close_port(self.port.port)
            self.rt.peers.unwatch(self.watched, self.port.port)
            tracer = self.rt.tracer
            if self._traced and tracer is not None:
                tracer.end(self.what, "call", f"{self.port.proc.name}:{self.port.port}")
        self.on_value(index, ok, value)


class OneCall:
    """The port of one message to one actor whose reply completes ``fut`` (``call_one``).

    What a `Collector` of one does, with less per call: no tracing span
    (the caller takes the general path while tracing), nothing registered to
    hear of its proc's loss (the runtime, when it loses a proc, fails the open
    ports whose handler's ``lost_with`` names it), and the first outcome
    (reply, loss of the proc, failure to send) taken by removing its port from
    the runtime's table (an atomic ``dict.pop``) instead of a lock.
    """

    __slots__ = ("fut", "label", "lost_with", "port", "rt", "what")
    direct = True  # deliver() may run on a thread that read the reply itself

    def __init__(self, rt: Runtime, what: str, proc: ProcId, label: str, fut: Pending) -> None:
        self.rt = rt
        self.what = what
        self.lost_with = proc.name  # the proc whose loss fails this call
        self.label = label
        self.fut = fut
        self.port: PortId = rt.router.open_port(self)

    def deliver(self, frame: Message) -> None:
        # The first outcome takes the port out of the runtime's table (atomic).
        if self.rt.router.ports.pop(self.port.port, None) is not None:
            self.fut.complete(True, Undecoded(frame, self.what))  # unpickled by the reader

    def fail(self, reason: str) -> None:
        """The message could not be sent."""
        self.peer_lost(self.lost_with, reason)

    def peer_lost(self, proc: str, reason: str) -> None:
        if proc != self.lost_with or self.rt.router.ports.pop(self.port.port, None) is None:
            return  # another proc, or not the first outcome
        err = SupervisionError(
            f"Actor call {self.what} failed: actor {self.label} is gone with its proc "
            f"{proc}: {reason}",
            actor=self.label,
            reason=reason,
        )
        self.fut.complete(False, err)


class Countdown:
    """Runs ``on_zero()`` once, after ``tick()`` has been called ``n`` times (any threads).

    With ``n == 0`` it runs at once. ``tick`` ignores its arguments, so it can be
    handed to anything that calls back with a result.
    """

    def __init__(self, n: int, on_zero: Callable[[], None]) -> None:
        self._left = n
        self._lock = threading.Lock()  # guards _left, the calls still due
        self._on_zero = on_zero
        if n == 0:
            on_zero()

    def tick(self, *_: Any) -> None:
        with self._lock:
            self._left -= 1
            last = self._left == 0
        if last:
            self._on_zero()


def wait_ready(
    rt: Runtime, procs: tuple[ProcId, ...] | list[ProcId], timeout: float = 120.0
) -> None:
    """Block until every proc in ``procs`` (peers of ``rt``) has booted or is lost
    (bounded by ``timeout``)."""
    if rt.on_io_thread():
        return
    done = threading.Event()
    countdown = Countdown(len(procs), done.set)
    for p in procs:
        rt.peers.when_ready(p, countdown.tick)
    done.wait(timeout)


def set_future(cf: concurrent.futures.Future[Any] | Pending, ok: bool, value: Any) -> None:
    """Complete ``cf`` unless it already is. A `Deferred` value is the result
    either way: whoever reads it gets its value or its exception."""
    if cf.done():
        return
    try:
        if ok or isinstance(value, Deferred):
            cf.set_result(value)
        else:
            cf.set_exception(value)
    except concurrent.futures.InvalidStateError:
        pass


class TreeCollector(Collector):
    """A collector for a message sent down the cast tree whose replies come straight back.

    Besides the procs of the actors it waits for, it watches the procs that
    forward to them: when one is lost, every pending reply from its subtree
    fails (those actors may never have received the message).
    """

    def __init__(
        self,
        rt: Runtime,
        what: str,
        n: int,
        on_value: Callable[[int, bool, Any], None],
        *,
        mesh_size: int,
        fanout: int,
        lost_is_ok: bool = False,
        lazy: bool = False,
    ) -> None:
        super().__init__(rt, what, n, on_value, lost_is_ok=lost_is_ok, lazy=lazy)
        self.mesh_size = mesh_size
        self.fanout = fanout
        self.ranks: dict[int, int] = {}  # index -> base rank
        self.rank_of: dict[str, int] = {}  # watched proc name -> its base rank

    def expect_tree(
        self, targets: list[tuple[int, int, ProcId]], procs: Any, ancestors: bool
    ) -> None:
        """Expect ``(index, rank, proc)`` for each target; watch the forwarders too."""
        for index, rank, proc in targets:
            self.ranks[index] = rank
            self.rank_of[proc.name] = rank
        if ancestors:
            for _, rank, _ in targets:
                for lo, _hi in tree.path(rank, self.mesh_size, self.fanout)[:-1]:
                    name = procs[lo].name
                    # A forwarder known to be lost already is routed around: no watch.
                    if (
                        name not in self.rank_of
                        and self.rt.peers.watch(procs[lo], self.port.port) is None
                    ):
                        self.rank_of[name] = lo
                        self.watched.add(name)

    def peer_lost(self, proc: str, reason: str) -> None:
        rank = self.rank_of.get(proc)
        if rank is None:
            super().peer_lost(proc, reason)
            return
        lo, hi = tree.node_range(rank, self.mesh_size, self.fanout)
        for index in list(self.pending):
            r = self.ranks.get(index, -1)
            if lo <= r < hi:
                why = reason
                if r != rank:
                    why = f"proc {proc}, which forwards this message to it, was lost: {reason}"
                self._lost_one(index, proc, why)


class GatherCollector:
    """Replies of a gathered cast (``call()`` on a large mesh), one combined message per
    subtree: plain values come in bulk to ``on_values(slots, values)``, anything else
    to ``on_value(slot, ok, value)``; each slot once."""

    def __init__(
        self,
        rt: Runtime,
        what: str,
        name: str,
        n: int,
        selection: tree.Selection,
        on_value: Callable[[int, bool, Any], None],
        on_values: Callable[[Sequence[int], Sequence[Any]], None],
    ) -> None:
        self.what = what
        self.name = name
        self.on_value = on_value
        self.on_values = on_values
        self._done = bytearray(n)
        self._lock = threading.Lock()  # guards _done, the slots answered
        self.root = RootGather(rt.tree, selection, self._entry, self._lost, self._values)
        self.port = None  # replies come as GATHERs to root.port

    def _values(self, slots: Sequence[int], values: Sequence[Any]) -> None:
        done = self._done
        with self._lock:
            lo, hi = min(slots), max(slots) + 1
            # A fresh run of distinct slots (the usual case: one subtree of a slice).
            if hi - lo == len(slots) and not done.count(1, lo, hi) and len(set(slots)) == hi - lo:
                done[lo:hi] = b"\x01" * (hi - lo)
                fresh = None
            else:
                fresh = [i for i, s in enumerate(slots) if not done[s]]
                for i in fresh:
                    done[slots[i]] = 1
        if fresh is None:
            self.on_values(slots, values)
            return
        if len(fresh) == len(slots):
            self.on_values(slots, values)
        elif fresh:
            self.on_values([slots[i] for i in fresh], [values[i] for i in fresh])

    def _first(self, slot: int) -> bool:
        with self._lock:
            if self._done[slot]:
                return False
            self._done[slot] = 1
            return True

    def _entry(self, slot: int, status: int, body: Any, bufs: Any) -> None:
        if not self._first(slot):
            return
        msg = Message(Kind.REPLY, Reply(0, slot, status), memoryview(body), list(bufs))
        lazy = Undecoded(msg, self.what)
        self.on_value(slot, lazy.ok, lazy)

    def _lost(self, slot: int, rank: int, why: str) -> None:
        if self._first(slot):
            self.on_value(slot, False, _unreached(self.what, f"{self.name}[{rank}]", why))

    def fail_supervision(self, index: int, why: str) -> None:
        if self._first(index):
            err = SupervisionError(
                f"Actor call {self.what} failed: {why}", actor=self.what, reason=why
            )
            self.on_value(index, False, err)

    def fail(self, slot: int, rank: int, why: str) -> None:
        self._lost(slot, rank, why)


def _unreached(what: str, label: str, why: str) -> SupervisionError:
    return SupervisionError(
        f"Actor call {what} failed: actor {label} was not reached: {why}", actor=label, reason=why
    )
