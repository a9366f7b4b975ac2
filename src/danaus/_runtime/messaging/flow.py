"""Backpressure on the receiving side: bounded queues of bytes waiting for a consumer.

A `Gate` counts the bytes queued for one consumer (an actor's inbox,
a port receiver). A frame that arrives while the gate is above its high-water
mark pauses the connection it came on (the I/O thread stops reading it, so
the sender's bytes back up in the kernel and then in the sender's backlog,
where the runtime blocks the sender's thread). When the consumer has taken
enough to bring the gate down to its low-water mark, the paused connections
are read again.

A consumer that cannot consume because it waits for something (an actor
blocked in ``Future.get()`` or in a send that is itself held back) is
*exempt*: its gate pauses nothing and lets go of what it paused, since the
message it waits for may be behind the paused bytes. Memory then grows past
the mark for as long as the wait lasts, but no cycle of waits can form
through a paused connection (``docs/design.md``, "Backpressure").
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from ... import _config as config

if TYPE_CHECKING:
    from ..._transport.conn import Connection
    from ..._wire.protocol import Message

__all__ = ["Gate", "GateHost", "frame_bytes"]


class GateHost(Protocol):
    """What a gate needs of its runtime's backpressure (``backpressure.Backpressure``):
    pausing and resuming connections."""

    def pause_delivering(self, gate: Gate) -> Any: ...

    def resume_reading(self, conns: list[Any], gate: Gate) -> None: ...


def frame_bytes(msg: Message) -> int:
    """The bytes a received message holds (its body and buffers)."""
    n = len(msg.body)
    for b in msg.buffers:
        n += memoryview(b).nbytes
    return n


class Gate:
    """The bytes queued for one consumer; above high water, their connections pause.

    ``arrived`` runs on the I/O thread (inside the dispatch of the frame),
    ``taken`` on the consumer's thread, ``exempt_changed`` whenever
    ``exempt()`` may have turned true.
    """

    __slots__ = ("_exempt", "_lock", "_paused", "bytes", "flow", "high", "low")

    def __init__(self, flow: GateHost, exempt: Callable[[], bool], *, high: str, low: str) -> None:
        self.flow = flow  # the runtime's backpressure: pauses and resumes connections
        self._exempt = exempt
        self.high: int = config.get(high)
        self.low: int = config.get(low)
        self.bytes = 0
        self._lock = threading.Lock()  # guards bytes, high and the paused connections
        self._paused: list[Connection] = []

    def arrived(self, n: int) -> None:
        """``n`` bytes were queued (I/O thread): pause their connection if over the mark."""
        with self._lock:
            self.bytes += n
            if self.bytes <= self.high or self.high <= 0 or self._exempt():
                return
            conn = self.flow.pause_delivering(self)
            if conn is None:
                return
            self._paused.append(conn)
            # The consumer may have begun to wait between the check above and the
            # pause: it then saw no holding gate and asked nobody to let go. Now that
            # this gate counts as holding, one of the two sees the other (in that
            # order on both sides), so check again.
            if not self._exempt():
                return
            conns, self._paused = self._paused, []
        self.flow.resume_reading(conns, self)

    def taken(self, n: int) -> None:
        """The consumer took ``n`` bytes (any thread)."""
        with self._lock:
            self.bytes -= n
            if not self._paused or self.bytes > self.low:
                return
            conns, self._paused = self._paused, []
        self.flow.resume_reading(conns, self)

    def exempt_changed(self) -> None:
        """The consumer may have started waiting: let go of what this gate paused."""
        with self._lock:
            if not self._paused or not self._exempt():
                return
            conns, self._paused = self._paused, []
        self.flow.resume_reading(conns, self)

    def close(self) -> None:
        """The consumer is gone: read on (what arrives now is refused, not queued)."""
        with self._lock:
            conns, self._paused = self._paused, []
            self.high = 0
        if conns:
            self.flow.resume_reading(conns, self)

    @property
    def holding(self) -> bool:
        return bool(self._paused)

    def __repr__(self) -> str:
        return f"<Gate {self.bytes} bytes, {len(self._paused)} paused>"
