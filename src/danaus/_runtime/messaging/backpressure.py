"""Backpressure in a runtime: senders held back, connections paused, threads waiting.

A part of `Runtime` (``rt.backpressure``),
handed the callables it needs (never the runtime).
Sending side: a thread other than the I/O thread that sends to a peer whose
outbound bytes (queued for a proc still starting, in the connection's backlog,
offloaded and not yet released) exceed ``send_high_water`` blocks until they
fall to ``send_low_water`` or the peer is lost. Receiving side: a consumer's
``flow.Gate`` pauses the connection whose frame is being dispatched, and lets
go when the consumer catches up or begins to wait (``begin_wait``): what it
waits for may be behind the paused bytes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from ... import _config as config

if TYPE_CHECKING:
    import asyncio

    from ..._transport.conn import Connection
    from .flow import Gate
    from .peers import _Peer

__all__ = ["Backpressure"]


class Backpressure:
    """One runtime's backpressure state: who waits for room, who is paused, who waits.

    ``loop``: the I/O loop; ``on_io_thread()`` and ``call_soon(fn, *args)``: the
    runtime's; ``closed()``: the runtime has closed; ``is_lost(name)``: why proc
    ``name`` is lost (None: it is not); ``offloaded(name, 0)``: bytes offloaded
    to it and not yet released; ``flush_held()``: send the held write batches.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        *,
        on_io_thread: Callable[[], bool],
        call_soon: Callable[..., None],
        closed: Callable[[], bool],
        is_lost: Callable[[str], str | None],
        offloaded: Callable[[str, int], int],
        flush_held: Callable[[], None],
    ) -> None:
        self.loop = loop
        self._on_io_thread = on_io_thread
        self._call_soon = call_soon
        self._closed = closed
        self._is_lost = is_lost
        self._offloaded = offloaded
        # Guards room_waiters; senders wait on it for a peer's backlog to drain.
        self._room = threading.Condition(threading.Lock())
        self.room_waiters = 0  # senders blocked in wait_for_room (read without the lock)
        # The connection whose frame the I/O thread is dispatching (set by Runtime._dispatch).
        self.delivering: Connection | None = None
        self._holding: set[Gate] = set()  # gates that paused a connection (I/O thread)
        self.held_back = 0  # sends that had to wait for a backlog to drain (a statistic)
        self.pauses = 0  # times a connection was paused for a full inbox (a statistic)
        self.waits = 0  # threads of this process blocked on a future or a held-back send
        self._waits_lock = threading.Lock()  # guards waits (changed by any thread)
        # _block_hook(True/False) around a held-back send (set_block_hook: the actor
        # layer's blocked actor's inbox stops pausing connections meanwhile)
        self._block_hook: Callable[[bool], None] | None = None
        # A thread of this process starts to wait: held write batches go out now.
        self._flush_held = flush_held

    def set_block_hook(self, hook: Callable[[bool], None] | None) -> None:
        self._block_hook = hook

    # -- sending side ---------------------------------------------------------

    @property
    def send_high(self) -> int:
        high: int = config.get("send_high_water")
        return high if high > 0 else 1 << 62

    def outbound(self, peer: _Peer) -> int:
        """Bytes on their way to ``peer`` that this process still holds."""
        conn = peer.conn
        n = peer.queued_bytes + self._offloaded(peer.proc.name, 0)
        if conn is not None:
            n += conn.backlog_bytes
        return n

    def wait_for_room(self, peer: _Peer) -> None:
        """Block until what we hold for ``peer`` falls to the low-water mark (not on the
        I/O thread, which never blocks), or ``peer`` is lost, or we close."""
        if self._on_io_thread() or not self.loop.is_running():
            return  # the I/O thread never blocks (nor a thread before the loop runs)
        low: int = config.get("send_low_water")
        self.held_back += 1
        self.begin_wait(blocked=True)
        try:
            with self._room:
                self.room_waiters += 1
                try:
                    while peer.lost is None and not self._closed():
                        conn = peer.conn
                        if self.outbound(peer) <= low:
                            return
                        if conn is not None and conn.closed:
                            return  # the loss is on its way; send() reports it
                        if conn is not None:
                            conn.want_drain(low)
                        # Woken by a drain, a release or a loss; the timeout only
                        # re-checks (a wake-up is never needed for correctness).
                        self._room.wait(0.5)
                finally:
                    self.room_waiters -= 1
        finally:
            self.end_wait(blocked=True)

    def wait_sent(self, name: str, sent: threading.Event) -> None:
        """Block until ``sent`` is set (a lent frame to proc ``name`` has left this
        process's memory), ``name`` is lost, or we close; a waiting thread, as for
        ``wait_for_room``, so that nothing it waits for stays paused behind it."""
        if sent.is_set():
            return
        self.begin_wait(blocked=True)
        try:
            # Woken by the frame's end; the timeout only re-checks the peer and the runtime.
            while not sent.wait(0.5):
                if self._closed() or self._is_lost(name) is not None:
                    return
        finally:
            self.end_wait(blocked=True)

    def notify_room(self) -> None:
        """Wake senders waiting for a backlog to drain (any thread)."""
        if self.room_waiters:
            with self._room:
                self._room.notify_all()

    # -- threads that wait ----------------------------------------------------

    def begin_wait(self, *, blocked: bool = False) -> None:
        """A thread of this process starts waiting (a future, a held-back send).

        Gates that paused a connection let go if their consumer may be that
        thread: what it waits for may be behind the paused bytes.
        """
        self._flush_held()  # frames held for a batched write may be what it waits for
        with self._waits_lock:
            self.waits += 1
        if blocked and self._block_hook is not None:
            self._block_hook(True)
        if self._holding:
            self._call_soon(self._exemptions_changed)

    def end_wait(self, *, blocked: bool = False) -> None:
        if blocked and self._block_hook is not None:
            self._block_hook(False)
        with self._waits_lock:
            self.waits -= 1

    def _exemptions_changed(self) -> None:
        for gate in list(self._holding):
            gate.exempt_changed()

    # -- receiving side -------------------------------------------------------

    def pause_delivering(self, gate: Gate) -> Connection | None:
        """Stop reading the connection whose frame is being dispatched (I/O thread).

        None on another thread (a direct read): ``delivering`` is the I/O
        thread's, and only the I/O thread may pause a connection."""
        conn = self.delivering
        if conn is None or conn.closed or not self._on_io_thread():
            return None
        conn.pause(gate)
        self.pauses += 1
        self._holding.add(gate)
        return conn

    def resume_reading(self, conns: list[Connection], gate: Gate) -> None:
        """Read ``conns`` again, as far as ``gate`` is concerned (any thread)."""

        def resume() -> None:
            if not gate.holding:
                self._holding.discard(gate)
            for conn in conns:
                conn.resume(gate)

        self._call_soon(resume)
