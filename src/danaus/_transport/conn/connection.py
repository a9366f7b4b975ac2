"""``Connection``: one end of a framed connection, coordinating its parts."""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
import ssl
from collections.abc import Callable, Hashable
from typing import Any, Protocol

from ... import _config as config
from ..._errors import ConnectionClosedError, PeerBrokenError
from ..._wire.frame import Frame, FrameError
from ..auth import TAG, AuthError, Handshake, Session
from .batching import Batching
from .buffers import set_unix_sndbuf
from .direct import DirectReader
from .opening import Opening
from .reader import FrameReader
from .stats import ConnStats
from .writer import WriteBatcher

log = logging.getLogger("danaus.transport")


class _Stat:
    """One of ``ConnStats``' counters, read as an attribute of the connection
    (``conn.frames_sent`` is ``conn.stats.frames_sent``)."""

    __slots__ = ("name",)

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, conn: Any, owner: type | None = None) -> Any:
        if conn is None:  # read on the class
            return self
        return getattr(conn.stats, self.name)


class _Send(Protocol):
    """The signature of ``WriteBatcher.send`` (bound as ``Connection.send``)."""

    def __call__(
        self, parts: list[Any], on_left: Callable[[], None] | None = ..., *, copy: bool = ...
    ) -> None: ...


class Connection:
    """One end of a framed connection. Create on the I/O thread, use from anywhere.

    It coordinates its parts and owns what they share: the socket, the TLS and
    secret handshakes, the peer's identity, ``closed`` and closing. The parts:
    ``writer`` (`WriteBatcher`), ``reader`` (`FrameReader`),
    ``direct`` (`DirectReader`) and ``stats`` (`ConnStats`). Their
    hot entry points (``send``, ``read_directly``...) are bound here once.
    """

    # Bound in __init__ to the part that does the work (no extra call per frame).
    send: _Send
    flush_held: Callable[[], None]
    want_drain: Callable[[int], None]
    pause: Callable[[Hashable], None]
    resume: Callable[[Hashable], None]
    read_directly: Callable[..., bool | None]
    _on_readable: Callable[[], None]

    def __init__(
        self,
        sock: socket.socket,
        loop: asyncio.AbstractEventLoop,
        on_frame: Callable[[Connection, Frame], None],
        on_close: Callable[[Connection, BaseException | None], None],
        *,
        on_authenticated: Callable[[Connection], None] | None = None,
        max_frame: int | None = None,
        handshake: Handshake | None = None,
        handshake_timeout: float | None = None,
        tls: ssl.SSLContext | None = None,
        server_side: bool = False,
        batching: Batching | None = None,
    ) -> None:
        sock.setblocking(False)
        # Bytes a frame may have to be written in one sendmsg, the socket's send buffer
        # permitting (Unix sockets only, whose buffer we enlarge: see UNIX_SNDBUF).
        self.one_write = set_unix_sndbuf(sock) if sock.family == socket.AF_UNIX else 0
        if tls is not None:
            # TLS first (non-blocking, driven by the loop), then the secret's handshake
            # inside it. SSL sockets have no sendmsg: frames are written part by part.
            sock = tls.wrap_socket(sock, server_side=server_side, do_handshake_on_connect=False)
        self.tls = tls is not None
        self.sock = sock
        self.loop = loop
        self.fd = sock.fileno()
        self._on_close = on_close
        self._flush_deadline: float | None = None
        self.closed = False  # set under writer.lock
        self.close_exc: BaseException | None = None
        self.peer: Any = None  # set by the runtime after the hello frame
        self.last_recv = loop.time()
        self.tcp = False  # set by the runtime: TCP (to another host) or Unix (this host)
        self.peer_pid: int | None = None  # the peer's pid, when it is on this host
        # Until the handshakes are done, nothing is decoded and nothing is sent but them.
        self.opening: Opening | None = Opening(
            self,
            handshake,
            self._opened,
            functools.partial(on_authenticated, self) if on_authenticated is not None else None,
            tls_pending=tls is not None,
        )
        self.stats = stats = ConnStats()
        self.direct = direct = DirectReader(self, stats)
        self.reader = reader = FrameReader(
            self, on_frame, max_frame, stats, direct, decode=handshake is None
        )
        direct._reader = reader
        self.writer = writer = WriteBatcher(
            self,
            batching if batching is not None else Batching(),
            stats,
            direct.sel_op,
            sealing=handshake is not None,
            opening=tls is not None,
        )
        self.send = writer.send
        self.flush_held = writer.flush_held
        self.want_drain = writer.want_drain
        self.pause = reader.pause
        self.resume = reader.resume
        self.read_directly = direct.read_directly
        self._on_readable = reader.on_readable
        if handshake is not None:
            if handshake_timeout is None:
                handshake_timeout = config.get("handshake_timeout")
            loop.call_later(handshake_timeout, self.opening.deadline, handshake_timeout)
        loop.add_reader(self.fd, self._on_readable)
        self.opening.begin()

    # -- what the parts hold, as the runtime and the metrics read it ---------------

    @property
    def backlog_bytes(self) -> int:
        """Bytes queued and not yet written to the socket (any thread; a snapshot)."""
        return self.writer.queued

    @property
    def last_send(self) -> float:
        """When a frame was last sent (the loop's clock)."""
        return self.writer.last_send

    @property
    def on_drained(self) -> Callable[[], None] | None:
        """Called on the I/O thread once the backlog falls as asked (``want_drain``)."""
        return self.writer.on_drained

    @on_drained.setter
    def on_drained(self, fn: Callable[[], None] | None) -> None:
        self.writer.on_drained = fn

    @property
    def direct_frame(self) -> Callable[[Connection, Frame], bool] | None:
        """Set by the runtime: handle a frame on the reading thread (``read_directly``)."""
        return self.direct.direct_frame

    @direct_frame.setter
    def direct_frame(self, fn: Callable[[Connection, Frame], bool] | None) -> None:
        self.direct.direct_frame = fn

    @property
    def paused(self) -> bool:
        return bool(self.reader.paused_by)

    # the counters (``ConnStats``), read on the connection
    frames_sent = _Stat()
    bytes_sent = _Stat()
    frames_recv = _Stat()
    bytes_recv = _Stat()
    recv_off_loop = _Stat()
    frames_direct = _Stat()
    spins_hit = _Stat()
    spins_missed = _Stat()

    # -- TLS and the secret's handshake (I/O thread) --------------------------------

    def _opened(self, session: Session | None, handshook: bool) -> None:
        """The connection is open (I/O thread): TLS's handshake and the secret's, where
        there are, are done. After the secret's, frames are decoded from now on, sealed
        and checked with ``session`` when there is one (not with TLS)."""
        self.opening = None
        if not handshook:
            self.writer.start()
            return
        reader = self.reader
        if session is not None:
            reader.decoder = reader.new_decoder(trailer=TAG, check=session.check)
        else:
            reader.decoder = reader.new_decoder()
        self.writer.authenticated(session)

    @property
    def authenticated(self) -> bool:
        return self.opening is None or self.opening.hs is None

    def _release_socket(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    # -- closing ------------------------------------------------------------

    def _fail(self, exc: BaseException, cause: BaseException | None) -> None:
        if cause is not None:
            exc.__cause__ = cause
        if isinstance(exc, (FrameError, AuthError)) and self.authenticated and not self.closed:
            # An authenticated peer sent a frame we refuse (malformed, too deep, a bad
            # tag): one line, and only this connection closes.
            log.warning("closing the connection from %s: %s", self._label(), exc)
        self._close(exc)

    def _label(self) -> str:
        if self.peer is not None:
            return str(self.peer)
        try:
            return str(self.sock.getpeername()) or "a local peer"
        except OSError:
            return "a peer"

    def fail_now(self, why: str) -> None:
        """Close as if the peer broke (I/O thread): everything waiting on it is told."""
        self._fail(PeerBrokenError(why), cause=None)

    def close(self) -> None:
        """Close from this side (I/O thread). Queued bytes not yet written are dropped."""
        self._close(None)

    def close_threadsafe(self) -> None:
        self.loop.call_soon_threadsafe(self.close)

    def flush_and_close(self) -> None:
        """Close once the backlog is written, or after ``flush_timeout`` s (I/O thread)."""
        now = self.loop.time()
        if self._flush_deadline is None:
            self._flush_deadline = now + config.get("flush_timeout")
        self.flush_held()
        with self.writer.lock:
            pending = bool(self.writer.backlog) or self.reader.thread is not None
        if pending and not self.closed and now < self._flush_deadline:
            self.loop.call_later(0.01, self.flush_and_close)
        elif self.tcp and not self.tls and not self.closed and not pending:
            self._shut_and_linger()
        else:
            self.close()

    def _shut_and_linger(self) -> None:
        """End our direction, then read and drop until the peer's EOF (I/O thread).

        A TCP socket closed while bytes it received are still unread sends a
        reset instead of a FIN, and a reset makes the peer's kernel throw away
        what it had received but not yet read: the last frames we wrote would
        be lost. The connection carries both directions, so the peer's pings
        can always be in flight; hence the shutdown and the wait for its EOF
        (bounded by ``flush_timeout``).
        """
        try:
            self.direct.sel_op(self.loop.remove_reader, self.fd)
            self.sock.shutdown(socket.SHUT_WR)
        except (OSError, ValueError, RuntimeError):
            self.close()
            return
        self._linger()

    def _linger(self) -> None:
        while not self.closed:
            try:
                data = self.sock.recv(1 << 16)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self.close()
                return
            if not data:  # the peer's EOF: everything we wrote was read
                self.close()
                return
        if self.closed:
            return
        if self._flush_deadline is not None and self.loop.time() < self._flush_deadline:
            self.loop.call_later(0.01, self._linger)
        else:
            self.close()

    def _close(self, exc: BaseException | None) -> None:
        reader = self.reader
        direct = self.direct
        with self.writer.lock:
            if self.closed:
                return
            self.closed = True
            self.close_exc = exc if exc is not None else ConnectionClosedError("closed by us")
            told = self.writer.drop_locked()
            reader.paused_by.clear()
            reader.held_frames.clear()
        with direct.mu:
            # One step: the loop forgets the socket before anyone may close it. A thread
            # reading it (a direct reader, or the reader of a large frame) is woken by
            # the shutdown and closes it when it stops, so its descriptor is never
            # reused under it; otherwise we close it now.
            try:
                self.loop.remove_reader(self.fd)
                self.loop.remove_writer(self.fd)
            except (ValueError, OSError, RuntimeError):
                pass
            direct.unwatched = True
            reading = direct.active or reader.thread is not None
            if reading:
                try:
                    self.sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        if not reading:
            self._release_socket()
        for fn in told:  # senders waiting for their frames to leave: they never will
            fn()
        self._on_close(self, exc)
