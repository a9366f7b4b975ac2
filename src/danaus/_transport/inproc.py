"""In-process connections: procs that are objects in one Python process.

An address entry ``inproc:NAME`` names a runtime of this process that
listens on a `Network` the dialler shares (``Network.listen``). A
connection to it is a pair of `InprocConnection` objects, one on each
runtime's event loop (several runtimes may share one loop). Each frame is
encoded by the sender and decoded by the receiver, as on a socket, and handed
over in order with ``call_soon``, so per-connection FIFO, the frame format and
the header checks are the real ones; only the bytes do not cross the kernel.
Closing one end shows the other an EOF after every frame already sent, as a
socket would.

This is what lets tests and benchmarks build meshes of thousands of procs on
a small machine (``danaus.testing.SimulatedMesh``). Like a Unix socket it
needs no authentication: only code in this process can reach it.

Imports: ``_errors``, ``_wire``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Hashable, Iterable
from typing import TYPE_CHECKING, Any

from .._errors import ConnectionClosedError, PeerBrokenError
from .._wire.frame import Frame, decode_frame, flat

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

__all__ = ["InprocConnection", "Network"]

Acceptor = Callable[["InprocConnection"], None]


class Network:
    """The in-process "network" of the runtimes that share it: like the kernel's
    table of Unix sockets, the names listened on and who accepts there.

    A runtime makes one (``state.Transport``) and closes it with itself; the
    runtimes of a simulated mesh share the one of the runtime that built it.
    """

    def __init__(self) -> None:
        # name -> (the acceptor's loop, its accept callback)
        self._listeners: dict[str, tuple[asyncio.AbstractEventLoop, Acceptor]] = {}
        self._lock = threading.Lock()  # guards _listeners and closed
        self.closed = False

    def listen(self, name: str, loop: asyncio.AbstractEventLoop, accept: Acceptor) -> None:
        """Accept connections to ``inproc:name``: ``accept(conn)`` runs on ``loop``.

        ``OSError`` if the name is taken or the network is closed.
        """
        with self._lock:
            if self.closed:
                raise OSError(f"cannot listen on inproc:{name}: its runtime has closed")
            if name in self._listeners:
                raise OSError(f"inproc address {name!r} is in use")
            self._listeners[name] = (loop, accept)

    def is_listening(self, name: str) -> bool:
        """Whether a runtime on this network accepts connections on ``inproc:name``."""
        return name in self._listeners

    def unlisten(self, name: str) -> None:
        """Stop accepting on ``inproc:name`` (existing connections stay)."""
        with self._lock:
            self._listeners.pop(name, None)

    def connect(
        self,
        name: str,
        loop: asyncio.AbstractEventLoop,
        on_frame: Callable[[InprocConnection, Frame], None],
        on_close: Callable[[InprocConnection, BaseException | None], None],
    ) -> InprocConnection:
        """Connect to ``inproc:name`` from a runtime on ``loop``.

        ``ConnectionRefusedError`` if nothing listens there (on this network).
        """
        with self._lock:
            entry = self._listeners.get(name)
        if entry is None:
            raise ConnectionRefusedError(f"nothing listens on inproc:{name} in this process")
        their_loop, accept = entry
        mine = InprocConnection(loop)
        mine.bind(on_frame, on_close)
        theirs = InprocConnection(their_loop)
        mine.other, theirs.other = theirs, mine
        _hand_over(their_loop, accept, theirs)
        return mine

    def close(self) -> None:
        """Stop every listener; later ``listen`` calls fail (existing connections stay)."""
        with self._lock:
            self.closed = True
            self._listeners.clear()


def _hand_over(loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any) -> None:
    """Run ``fn(*args)`` on ``loop``, after whatever was handed over to it before."""
    try:
        if asyncio.get_running_loop() is loop:
            loop.call_soon(fn, *args)
            return
    except RuntimeError:
        pass
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # that loop is closed: its runtime is gone
        pass


class InprocConnection:
    """One end of an in-process connection; the interface of ``_transport.conn.Connection``
    that a runtime uses. Create with `Network.connect()`; use from any thread."""

    tcp = None  # neither TCP nor a Unix socket: a runtime's heartbeat leaves it alone
    tls = False
    authenticated = True
    # Frames are handed over at once, so nothing is ever backlogged here and
    # backpressure (pause/resume, drain waits) has nothing to hold back.
    backlog_bytes = 0
    paused = False
    on_drained: Callable[[], None] | None = None

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.other: InprocConnection | None = None
        self.peer: Any = None
        self.peer_pid: int | None = None
        self.closed = False
        self.close_exc: BaseException | None = None
        self.last_recv = self.last_send = loop.time()
        self.frames_sent = 0
        self.frames_received = 0
        self._on_frame: Callable[[InprocConnection, Frame], None] | None = None
        self._on_close: Callable[[InprocConnection, BaseException | None], None] | None = None

    def bind(
        self,
        on_frame: Callable[[InprocConnection, Frame], None],
        on_close: Callable[[InprocConnection, BaseException | None], None],
    ) -> None:
        """Set what happens to frames and to the close (the accepting side, at accept)."""
        self._on_frame, self._on_close = on_frame, on_close

    def send(
        self, parts: list[Any], on_left: Callable[[], None] | None = None, *, copy: bool = False
    ) -> None:
        """Send one encoded frame (``encode_frame``'s parts); never blocks.
        ``on_left()``, if given, is called once ``parts`` are no longer needed (here:
        at once, since they are copied).

        Raises ``ConnectionClosedError`` once this end is closed.
        """
        if self.closed:
            raise ConnectionClosedError("closed by us") from self.close_exc
        frame = decode_frame(b"".join(parts))  # a copy, as a socket makes
        self.frames_sent += 1
        self.last_send = self.loop.time()
        assert self.other is not None
        _hand_over(self.other.loop, self.other._receive, frame)
        if on_left is not None:
            on_left()

    def send_message(
        self, header: tuple[Any, ...], body: ReadableBuffer, buffers: Iterable[ReadableBuffer]
    ) -> None:
        """Send a frame without encoding it: ``header`` is a wire tuple of immutable
        builtins and ids, shared as is; body and buffers are copied unless immutable."""
        if self.closed:
            raise ConnectionClosedError("closed by us") from self.close_exc
        if type(body) is not bytes:
            body = bytes(body)
        bufs = [memoryview(b if type(b) is bytes else bytes(flat(b))) for b in buffers]
        self.frames_sent += 1
        assert self.other is not None
        _hand_over(self.other.loop, self.other._receive, Frame(header, memoryview(body), bufs))

    def _receive(self, frame: Frame) -> None:
        if self.closed or self._on_frame is None:
            return
        self.frames_received += 1
        self.last_recv = self.loop.time()
        self._on_frame(self, frame)

    @property
    def frames_recv(self) -> int:  # the name a socket connection's counter has
        return self.frames_received

    bytes_sent = bytes_recv = 0  # frames are not encoded here: no bytes to count

    def pause(self, who: Hashable) -> None:
        """Backpressure on an in-process connection: nothing to stop (see ``paused``)."""

    def resume(self, who: Hashable) -> None:
        """Undo `pause()` (a no-op, as it is)."""

    def want_drain(self, low: int) -> None:
        """A sender waits for the backlog to drain: it is always empty here."""

    def fail_now(self, why: str) -> None:
        """Close as if the peer broke (its loop's thread)."""
        self._close(PeerBrokenError(why))

    def close(self) -> None:
        """Close this end (its loop's thread); the other end sees EOF after what was sent."""
        self._close(None)

    def close_threadsafe(self) -> None:
        _hand_over(self.loop, self.close)

    def flush_and_close(self) -> None:
        self._close(None)  # nothing is ever queued on this side

    def _peer_closed(self) -> None:
        self._close(PeerBrokenError("connection closed by peer (EOF)"))

    def _close(self, exc: BaseException | None) -> None:
        if self.closed:
            return
        self.closed = True
        self.close_exc = exc if exc is not None else ConnectionClosedError("closed by us")
        if self.other is not None:
            _hand_over(self.other.loop, self.other._peer_closed)
        if self._on_close is not None:
            self._on_close(self, exc)
