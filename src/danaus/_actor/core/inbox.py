"""An actor's inbox: the order its items run in, backpressure on what brings them,
and draining what is left when the actor stops.

The I/O thread (and a thread that read a call directly) puts calls in with
`Inbox.deliver()`; anyone puts the other items (`Stop`,
`Supervise`, `Bounced`) in with `Inbox.put()`; the actor's own
thread takes them out, one at a time, in the order they were put in: each
sender→actor pair is FIFO. A sync actor takes them with `Inbox.poll`
and, when there is none, `Inbox.wait_next()`; an async one awaits
`Inbox.next_async()` on its event loop.

**Backpressure.** The bytes of the calls in the inbox are counted by a
`Gate`: above ``inbox_high_water`` the
connections bringing more pause, unless the actor cannot consume now. It
cannot while it waits on a future (`begin_wait()`), while one of its own
sends is held back (`held_back()`) or once it stopped: then what would
unblock it may be behind the paused bytes.

**Deadlocks.** While the actor waits, a call whose chain of waiting actors
includes this one can never run: it is refused at once (when it arrives, or
when the wait begins for one already queued), by the callbacks the cell gives.

**Draining.** After `close()`, nothing is queued any more: each item put in
(and each left in the queue) is handed to the ``refuse`` callback, which
answers it ("was stopped"), so nothing is dropped silently.

**Reading directly.** A sync actor with nothing to do reads the connection its
last call came on itself, when no other thread reads it: a call then reaches
it without waking the I/O thread and then this one. Anything else put in
rings an ``eventfd`` (the *bell*) that ends that read.
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, ClassVar, NamedTuple, Protocol

from ..._runtime.messaging.flow import Gate, GateHost, frame_bytes
from ..._runtime.messaging.metrics import MessageRow, Recent
from ..._wire.ids import PortId, ProcId
from ..._wire.protocol import Message
from .waiting import Reader, Waits

__all__ = [
    "ANSWERED",
    "Bounced",
    "HookItem",
    "Inbox",
    "InboxFlow",
    "Item",
    "Stop",
    "Supervise",
]


# -- the inbox's items: one record per kind, told apart by type ------------------------
#
# A call (the per-message kind) is queued as its ``Message`` itself: nothing to build.


class Stop(NamedTuple):
    """Stop the actor; then reply ``None`` to ``port`` at ``slot`` (if any)."""

    port: PortId | None
    slot: int
    reason: str


class HookItem:
    """Run the actor's method ``hook`` with ``arg`` (if it has one), between messages."""

    __slots__ = ("arg",)
    hook: ClassVar[str]

    def __init__(self, arg: Any) -> None:
        self.arg = arg

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.arg!r})"


class Supervise(HookItem):
    """Run ``__supervise__(failure)`` between messages."""

    __slots__ = ()
    hook = "__supervise__"

    @property
    def failure(self) -> Any:
        return self.arg


class Bounced(HookItem):
    """Run ``_handle_undeliverable_message(envelope)`` between messages."""

    __slots__ = ()
    hook = "_handle_undeliverable_message"

    @property
    def envelope(self) -> Any:
        return self.arg


Item = Message | Stop | Supervise | Bounced


# -- what the inbox needs of its proc ---------------------------------------------------


class InboxFlow(Waits, GateHost, Protocol):
    """The proc's backpressure, as an inbox sees it (``Backpressure``): what its gate
    pauses and resumes connections through, and the waits it tells after its own."""


#: What `Inbox.take()` returns for a call already answered (refused as a deadlock).
ANSWERED = MessageRow(0, 0)

_IDLE_READ = 1.0  # s: an idle actor's direct read returns this often (and starts again)


class Inbox:
    """One actor's queue of items, with its backpressure and its drain (module doc).

    The lock guards ``stopped``, the wait and held-back counts, the calls queued
    and already answered, the sampled arrivals and the bell's state.
    """

    def __init__(
        self,
        flow: InboxFlow,
        *,
        recent: Recent | None,
        reader_for: Callable[[ProcId], Reader | None],
        flush_held: Callable[[], None],
        loop: asyncio.AbstractEventLoop | None,
        closes_cycle: Callable[[Message], bool],
        refuse_deadlock: Callable[[Message], None],
        refuse: Callable[[Item], None],
    ) -> None:
        # What it is handed of its proc: the backpressure, the messages table it samples
        # calls for (with metrics), the connections an idle actor may read, and the
        # batched writes it lets go of when idle.
        self._flow = flow
        self._reader_for = reader_for
        self._flush_held = flush_held
        self._closes_cycle = closes_cycle
        self._refuse_deadlock = refuse_deadlock
        self._refuse_item = refuse
        self._lock = threading.Lock()
        self.stopped = False
        self.waiting = 0  # how many waits (Future.get / await) are in progress on this actor
        self.blocked = 0  # sends of this actor held back by backpressure, in progress
        self.received = 0  # calls delivered (metrics; written under the lock)
        # Bytes in the inbox: above inbox_high_water the connections bringing more pause,
        # unless the actor cannot consume now (waiting, or itself held back).
        self.gate = Gate(flow, self._cannot_consume, high="inbox_high_water", low="inbox_low_water")
        self._queued: dict[int, Message] = {}  # calls in the inbox, for deadlock checks
        self._answered: set[int] = set()  # ids of queued calls refused meanwhile
        # Calls sampled for the messages table: id(frame) -> its row, set on delivery.
        self._recent = recent
        self._sampled: dict[int, MessageRow] = {}
        self._q: queue.SimpleQueue[Item] = queue.SimpleQueue()
        # A sync actor's next item, if there is one (else queue.Empty); then wait_next().
        # The queue's own method: no Python-level call per message.
        self.poll: Callable[[], Item] = self._q.get_nowait
        self.loop = loop  # an async actor's event loop: items go to _aq through it
        self._aq: asyncio.Queue[Item] | None = asyncio.Queue() if loop is not None else None
        # The bell (sync actors reading their connection when idle; see the module doc).
        self._home: ProcId | None = None  # the proc the last call came from, on its own
        self._bell = -1  # an eventfd, made by open_bell on the actor's thread
        self._bell_on = False  # the actor's thread is reading a connection
        self._rung = False  # the bell was rung and not read yet
        self._tid = 0  # the actor's thread's ident

    # -- putting in (I/O thread, and any thread for the other items) --------------------

    def deliver(self, frame: Message, sender: ProcId | None) -> None:
        """Queue a call (``Mailbox.deliver``); ``sender``: the peer whose connection
        brought it (None: this proc's copy of a cast)."""
        # Sampled for the telemetry query's messages table before the lock, to keep the
        # lock's hold short (take() tolerates races: they only blur its rate estimate).
        recent = self._recent
        stride = recent.take() if recent is not None else 0
        row = MessageRow(time.perf_counter_ns(), stride) if stride else None
        with self._lock:  # atomic with begin_wait: a cycling call is never missed
            cycles = bool(self.waiting) and self._closes_cycle(frame)
            self.received += 1
            if not cycles:
                self._queued[id(frame)] = frame
                if row is not None:
                    self._sampled[id(frame)] = row
        if cycles:
            self._refuse_deadlock(frame)
            return
        if sender is not None:  # a CALL frame on the connection from it (not a cast)
            self._home = sender if _single(frame.header.sizes) else None
        self.gate.arrived(frame_bytes(frame))
        self.put(frame)

    def direct_call(self, frame: Message, sender: ProcId | None) -> bool:
        """Take a call read directly by a thread other than the I/O thread (the
        runtime's ``_direct_frame``); False to leave it to the I/O thread, which
        alone may pause a connection (when it would push the inbox over its mark)."""
        gate = self.gate
        if gate.high > 0 and gate.bytes + frame_bytes(frame) > gate.high:
            return False
        self.deliver(frame, sender)
        return True

    def put(self, item: Item) -> None:
        """Queue ``item`` behind everything put in before it (or refuse it, once closed)."""
        with self._lock:
            if not self.stopped:
                if self.loop is not None:
                    assert self._aq is not None
                    self.loop.call_soon_threadsafe(self._aq.put_nowait, item)
                else:
                    self._q.put(item)
                    if self._bell_on and threading.get_ident() != self._tid:
                        # Its thread reads a connection (not this one, which is it):
                        # end that read. Under the lock, so the bell is still open.
                        try:
                            os.eventfd_write(self._bell, 1)
                        except OSError:  # full: it only needs to be readable
                            pass
                        self._rung = True
                return
        self._refuse(item)

    # -- taking out (the actor's thread) -------------------------------------------------

    def take(self, frame: Message) -> MessageRow | None:
        """The actor takes call ``frame`` to run it: its bytes leave the count. Returns its
        row for the messages table if it was sampled, `ANSWERED` if it was refused
        meanwhile (it must not run), else None."""
        self.gate.taken(frame_bytes(frame))
        key = id(frame)
        with self._lock:
            self._queued.pop(key, None)
            row = self._sampled.pop(key, None) if self._sampled else None
            if key in self._answered:
                self._answered.discard(key)
                return ANSWERED
        return row

    def next_async(self) -> Coroutine[Any, Any, Item]:
        """The next item of an async actor (await it on the actor's loop)."""
        assert self._aq is not None
        return self._aq.get()

    def wait_next(self) -> Item:
        """The next item of a sync actor that found none with `poll`: it is idle,
        so it lets go of its batched writes, then waits for one (module doc: reading
        directly)."""
        self._flush_held()
        q = self._q
        home = self._home
        conn = self._reader_for(home) if home is not None and self._bell >= 0 else None
        if conn is None:
            return q.get()
        self._bell_on = True
        try:
            while q.empty():
                if conn.read_directly(_queued(q), _IDLE_READ, self._bell) is None:
                    break  # another thread reads it
                if self._rung:  # set after the write: reading now finds it
                    self._rung = False
                    try:
                        os.eventfd_read(self._bell)
                    except BlockingIOError:
                        pass
        finally:
            self._bell_on = False
        return q.get()

    def open_bell(self, direct: bool) -> None:
        """On a sync actor's thread, before its first item; ``direct``: it may read its
        connection when idle (``direct_read``)."""
        self._tid = threading.get_ident()
        if direct:
            # Made now, not at the first idle wait: an actor costs the same descriptors
            # for its whole life (so leaks show as growth).
            self._bell = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)

    def close_bell(self) -> None:
        with self._lock:  # no put is ringing it
            self._bell_on = False
            bell, self._bell = self._bell, -1
        if bell >= 0:
            os.close(bell)

    # -- waiting and backpressure ---------------------------------------------------------

    def _cannot_consume(self) -> bool:
        return bool(self.waiting or self.blocked or self.stopped)

    def begin_wait(self) -> None:
        """The actor's thread is about to block on a future: refuse the calls that cycle
        back to it (they could never run), then tell the runtime (its gates let go)."""
        with self._lock:
            self.waiting += 1
            cycling = [f for f in self._queued.values() if self._closes_cycle(f)]
            for f in cycling:
                del self._queued[id(f)]
                self._answered.add(id(f))
        for f in cycling:
            self._refuse_deadlock(f)
        self._flow.begin_wait()

    def end_wait(self) -> None:
        self._flow.end_wait()
        with self._lock:
            self.waiting -= 1

    def held_back(self, blocked: bool) -> None:
        """A send of the actor's is held back by backpressure (or no more). While it is,
        this inbox pauses no connection: the bytes that would unblock it may be behind
        them (two actors sending to each other)."""
        with self._lock:
            self.blocked += 1 if blocked else -1

    @property
    def home(self) -> ProcId | None:
        """The proc whose connection the actor reads when idle (None: none)."""
        return self._home

    @property
    def queued(self) -> int:
        """How many calls are in the inbox (the dashboard's actors table)."""
        return len(self._queued)

    # -- draining -------------------------------------------------------------------------

    def close(self) -> None:
        """Take no more items: answer those left in a sync actor's queue, and every one
        put in from now on, with ``refuse``."""
        with self._lock:
            self.stopped = True
        while True:  # whatever arrived behind the stop is answered, never dropped
            try:
                self._refuse(self._q.get_nowait())
            except queue.Empty:
                break

    def close_loop(self) -> None:
        """An async actor's loop is done: answer what its queue still holds, and close it."""
        loop, aq = self.loop, self._aq
        assert loop is not None and aq is not None
        loop.run_until_complete(asyncio.sleep(0))  # run puts already scheduled
        while not aq.empty():
            self._refuse(aq.get_nowait())
        loop.close()

    def release(self) -> None:
        """The actor is gone: its connections read on, and it holds no call."""
        self.gate.close()
        self._queued.clear()
        self._sampled.clear()

    def _refuse(self, item: Item) -> None:
        if type(item) is Message:
            self.gate.taken(frame_bytes(item))
        self._refuse_item(item)


def _single(sizes: tuple[int, ...]) -> bool:
    """A call addressed to one actor (``call_one``, a one-actor mesh), not to several."""
    # A malformed header (a buggy peer) fails later, when the actor takes it.
    return type(sizes) is tuple and sizes.count(1) == len(sizes)


def _queued(q: queue.SimpleQueue[Item]) -> Callable[[], bool]:
    return lambda: not q.empty()
