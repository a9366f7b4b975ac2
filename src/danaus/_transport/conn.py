"""A framed, ordered, thread-safe connection on a non-blocking stream socket.

Reading happens on the I/O thread's event loop (``loop.add_reader``); frames
go to ``on_frame(conn, frame)`` in arrival order. A thread about to block for
a frame that comes on this connection may read it itself instead
(``read_directly``: a caller waiting for its reply, an idle actor for its next
call) while the I/O thread is not reading; what it does not take goes to the
I/O thread, in order. Writing may happen from any
thread: ``send(parts)`` writes straight to the socket while nothing is queued
(no thread hop on the hot path) and otherwise appends a snapshot of what is
left to a backlog that the I/O thread drains, so the bytes of one connection
are never interleaved, frames keep their order, and what is sent is what the
caller passed, even if it changes its arrays after ``send()`` returns. When
the peer breaks (EOF, reset, a bad frame) ``on_close(conn, exc)`` runs once on
the I/O thread.

Write batching: small frames that one thread sends back to back (the
previous send on the connection less than ``send_batch_delay`` ago, and no
thread of this process has started waiting since) are held and written
together, up to ``send_batch`` frames in one ``sendmsg``. What is held goes
out when the batch is full, when any thread of the process starts to wait
(:meth:`Batching.flush_held`, called by the runtime's ``begin_wait`` and by an
actor about to wait for its next message), when a frame that cannot be held
follows, or at the latest ``send_batch_delay`` later from the I/O thread. A
single call and its reply are never held (a wait came between them), and
nothing takes a thread hop.

Flow control: ``backlog_bytes`` counts what waits to be written (the runtime
blocks senders on other threads above a high-water mark; the I/O thread
itself never blocks), and ``on_drained`` runs on the I/O thread once the
backlog falls to ``drain_below`` after someone asked (``want_drain``). A
receiver that cannot take more pauses reading (``pause``/``resume``): the
peer's writes then back up in the kernel and, beyond it, in the peer's own
backlog, which blocks the peer's senders in turn.

A TCP connection with a job secret runs the handshake (``auth.py``) before
anything else, allocates its decode buffer only once it succeeded, and then
seals every frame it sends and checks every frame it receives with the
session's per-direction keys (a 32-byte tag after each frame), unless the
connection is TLS, which protects every byte already. With TLS only the I/O
thread touches the SSL object: other threads queue and wake it.

The :class:`Connection` coordinates one part per concern, each owning its
state: :class:`WriteBatcher` (the backlog, the held batch, flushing),
:class:`FrameReader` (the decoder, frames not yet delivered, pauses, large
frames), :class:`DirectReader` (the read role and a waiting thread's reads)
and :class:`ConnStats` (the counters).
"""

from __future__ import annotations

import asyncio
import collections
import errno
import logging
import os
import select
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any, Protocol

from .. import _config as config
from .._errors import ConnectionClosedError, PeerBrokenError, TransportError
from .._wire.frame import Frame, FrameDecoder, FrameError, recv_pool
from .auth import TAG, AuthError, Handshake, Session

__all__ = ["Batching", "ConnStats", "Connection", "DirectReader", "FrameReader", "WriteBatcher"]

log = logging.getLogger("danaus.transport")

_MAX_IOV = 512
_WOULD_BLOCK = (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError)
_READ_BUDGET = 64  # reads per wakeup before yielding to other connections


# One CPU: a spinning reader only delays the peer it waits for.
_SPIN_OK = len(os.sched_getaffinity(0)) > 1 if hasattr(os, "sched_getaffinity") else False
_SPIN_SKIP_MAX = 64  # waits without spinning after repeated misses, at most
_SPIN_NEAR = 3  # a miss whose wait was at most this many spins long does not skip
_HOLD_MAX = 16 << 10  # frames up to this size (one bytes part) may be held for a batch


class Batching:
    """The write batches of the connections of one runtime (``state.Transport``):
    which connections hold one, and the wait epoch that ends a burst.

    A connection made without one (a test's) gets one of its own.
    """

    __slots__ = ("epoch", "held")

    def __init__(self) -> None:
        self.held: set[WriteBatcher] = set()  # holding a batch (set.add/discard are atomic)
        self.epoch = 0  # changes whenever a thread of this process starts waiting

    def flush_held(self) -> None:
        """A thread of this process is about to wait: write every held batch now (any thread).

        Cheap when nothing is held. Sends after this are not held until one more
        send on the same connection shows a burst.
        """
        self.epoch += 1
        if self.held:
            for writer in list(self.held):
                writer.flush_held()

    def close(self) -> None:
        """Forget every connection (their runtime closed them, flushing what they held)."""
        self.held.clear()


class ConnStats:
    """The counters of one connection, for the metrics: frames and bytes each way,
    bytes of large frames received off the loop, frames read by a waiting thread,
    and its spins. Plain ints: the GIL keeps each ``+=`` whole."""

    __slots__ = (
        "bytes_recv",
        "bytes_sent",
        "frames_direct",
        "frames_recv",
        "frames_sent",
        "recv_off_loop",
        "spins_hit",
        "spins_missed",
    )

    def __init__(self) -> None:
        self.frames_sent = 0
        self.bytes_sent = 0
        self.frames_recv = 0
        self.bytes_recv = 0
        self.recv_off_loop = 0  # bytes of large frames received by a reader thread
        self.frames_direct = 0  # frames a waiting thread read and handled itself
        self.spins_hit = 0  # direct reads whose wait ended while they spun (frame or bell)
        self.spins_missed = 0  # ... and those that spun for nothing, then slept


class WriteBatcher:
    """The write side of one connection (any thread). It owns the backlog that
    waits for the socket and its byte count, the frames sent before the session
    key exists, the session that seals frames, the small frames held for one
    batched write (and their timer), the drain watermark, and the writer's
    registration with the loop."""

    __slots__ = (
        "_batching",
        "_conn",
        "_fd",
        "_hold",
        "_hold_epoch",
        "_hold_timer",
        "_in",
        "_loop",
        "_marks",
        "_out",
        "_sealing",
        "_sel_op",
        "_session",
        "_sock",
        "_stats",
        "_tls",
        "_unsealed",
        "_writer_armed",
        "backlog",
        "drain_below",
        "last_send",
        "lock",
        "on_drained",
        "queued",
    )

    def __init__(
        self,
        conn: Connection,
        batching: Batching,
        stats: ConnStats,
        sel_op: Callable[..., None],
        *,
        sealing: bool,
    ) -> None:
        self._conn = conn
        self._sock = conn.sock
        self._loop = conn.loop
        self._fd = conn.fd
        self._tls = conn.tls
        self._stats = stats
        self._sel_op = sel_op
        self._batching = batching
        # Guards what this class owns (backlog, byte count, unsealed frames, session,
        # held batch) and the connection's ``closed`` flag, which ``_close`` sets under it.
        self.lock = threading.Lock()
        self.backlog: collections.deque[memoryview] = collections.deque()
        self.queued = 0  # bytes in backlog and _unsealed: what waits to be written
        self._sealing = sealing  # the handshake is not done: frames wait in _unsealed
        self._session: Session | None = None
        # frames sent before the session key exists, and who to tell once each is out
        self._unsealed: list[tuple[list[Any], Callable[[], None] | None]] = []
        # Frames whose sender is told when their last byte leaves the backlog: (the
        # backlog's byte count `_in` after the frame, whom to tell); `_out` counts the
        # bytes written out of the backlog.
        self._marks: collections.deque[tuple[int, Callable[[], None]]] = collections.deque()
        self._in = 0
        self._out = 0
        self.drain_below = -1  # on_drained() once queued <= this (-1: nobody asked)
        self.on_drained: Callable[[], None] | None = None
        self._writer_armed = False
        self._hold: list[bytes] = []  # small frames held for one batched write
        self._hold_epoch = -1  # its epoch when this connection last wrote without holding
        self._hold_timer = False  # a flush of what is held is scheduled on the I/O thread
        self.last_send = conn.loop.time()

    def start(self) -> None:
        """Writing may begin (I/O thread): what was queued meanwhile goes out."""
        if self.backlog:
            with self.lock:
                self._arm_writer_locked()

    def authenticated(self, session: Session | None) -> None:
        """The handshake succeeded (I/O thread): seal with ``session`` from now on and
        queue, sealed, what was sent before."""
        with self.lock:
            self._sealing = False
            self._session = session
            for parts, on_left in self._unsealed:
                views = _views(self._sealed(parts))
                self.backlog.extend(views)
                self._in += _nbytes(views)
                if on_left is not None:
                    self._marks.append((self._in, on_left))
                if session is not None:
                    self.queued += TAG
            self._unsealed = []
            if self.backlog:
                self._arm_writer_locked()

    def drop_locked(self) -> list[Callable[[], None]]:
        """The connection closes (lock held): forget everything not yet written. Returns
        whom to tell that their frames are gone (to be called without the lock)."""
        self.backlog.clear()
        self._hold.clear()
        self._batching.held.discard(self)
        told = [f for _, f in self._marks] + [f for _, f in self._unsealed if f is not None]
        self._marks.clear()
        self._unsealed = []
        self.queued = 0
        return told

    def _sealed(self, parts: list[Any]) -> list[Any]:
        """``parts`` followed by their tag, if this connection authenticates frames."""
        if self._session is None:
            return parts
        return [*parts, self._session.seal(parts)]

    def send(
        self, parts: list[Any], on_left: Callable[[], None] | None = None, *, copy: bool = False
    ) -> None:
        """Queue ``parts`` (one encoded frame) for sending, in order. Never blocks.

        Without ``on_left``, what cannot be written at once is copied (a snapshot:
        the caller may change its arrays as soon as this returns). With it,
        ``on_left()`` is called (on this thread or the I/O thread) once the last
        byte of the frame has been handed to the kernel, or the connection closed;
        nothing is copied unless ``copy``, and without ``copy`` the caller must
        leave the memory of ``parts`` alone until then.

        Raises :class:`TransportError` if the connection is already closed (then
        ``on_left`` is not called).
        """
        if on_left is not None:
            self._send_large(parts, on_left, copy)
            return
        with self.lock:
            conn = self._conn
            if conn.closed:
                raise (
                    conn.close_exc
                    if isinstance(conn.close_exc, TransportError)
                    else ConnectionClosedError("connection is closed")
                )
            self._stats.frames_sent += 1
            now = self._loop.time()
            last, self.last_send = self.last_send, now
            if self._sealing:
                # Sealed once the handshake gives the key; a snapshot, since the caller
                # may change its arrays as soon as we return.
                owned = _owned(_views(parts))
                self._unsealed.append((owned, None))
                self.queued += _nbytes(owned)
                return
            if self._session is not None:
                parts = self._sealed(parts)
            if self.backlog or conn._tls_pending:
                self._queue_locked(_snapshot(parts))
                return
            hold = self._hold
            batching = self._batching
            if hold or (
                now - last < config.get("send_batch_delay") and self._hold_epoch == batching.epoch
            ):
                if self._hold_frame(parts, hold):
                    return
                parts = [*hold, *parts]  # what is held goes first, in one write
                hold.clear()
                batching.held.discard(self)
            self._hold_epoch = batching.epoch
            if self._tls and not _on_loop_thread(self._loop):
                # An SSL object must not be used by two threads at once (the I/O thread
                # reads it): let the I/O thread write.
                self._queue_locked(_snapshot(parts))
                self._arm_writer_locked()
                return
            window = config.get("coalesce_window")
            if window > 0 and now - last < window and not _on_loop_thread(self._loop):
                # Frames are coming in a burst: let the I/O thread write them together
                # (one syscall, one wake-up of the peer) instead of one by one.
                self._queue_locked(_snapshot(parts))
                self._arm_writer_locked()
                return
            self._write_now_locked(parts)

    def _send_large(self, parts: list[Any], on_left: Callable[[], None], copy: bool) -> None:
        """``send`` of a frame whose sender hears when it has left: what is not written
        at once is queued as views (or, with ``copy``, a snapshot), ``on_left`` at its end."""
        with self.lock:
            conn = self._conn
            if conn.closed:
                raise (
                    conn.close_exc
                    if isinstance(conn.close_exc, TransportError)
                    else ConnectionClosedError("connection is closed")
                )
            self._stats.frames_sent += 1
            self.last_send = self._loop.time()
            if self._sealing:
                kept = _owned(_views(parts)) if copy else parts
                self._unsealed.append((kept, on_left))
                self.queued += _total(kept)
                return
            if self._session is not None:
                parts = self._sealed(parts)
            views = _views(parts)
            hold = self._hold
            if hold:  # what is held goes first
                views = _views(hold) + views
                hold.clear()
                self._batching.held.discard(self)
            sent = 0
            if (
                not self.backlog
                and not conn._tls_pending
                and (not self._tls or _on_loop_thread(self._loop))
            ):
                try:
                    sent = self._write(views) if len(views) <= _MAX_IOV else 0
                except _WOULD_BLOCK:
                    sent = 0
                except OSError:
                    sent = 0  # the reader will notice too; the bytes stay queued
            rest = _skip(views, sent)
            if not rest:
                done = True
            else:
                done = False
                self._queue_locked(_owned(rest) if copy else rest)
                self._marks.append((self._in, on_left))
                self._arm_writer_locked()
        if done:
            on_left()

    def _hold_frame(self, parts: list[Any], hold: list[bytes]) -> bool:
        """Hold a small frame for a batched write (lock held); False if it cannot be."""
        if (
            len(parts) != 1
            or type(parts[0]) is not bytes
            or len(parts[0]) > _HOLD_MAX
            or self._tls
            or _on_loop_thread(self._loop)
        ):
            return False
        batch = config.get("send_batch")
        if batch <= 1:
            return False
        hold.append(parts[0])
        if len(hold) >= batch:
            frames = hold[:]
            hold.clear()
            self._batching.held.discard(self)
            self._write_now_locked(frames)
        elif len(hold) == 1:
            self._batching.held.add(self)
            if not self._hold_timer:
                self._hold_timer = True
                self._loop.call_soon_threadsafe(self._arm_hold_timer)
        return True

    def _arm_hold_timer(self) -> None:
        self._loop.call_later(config.get("send_batch_delay"), self._hold_timer_fired)

    def _hold_timer_fired(self) -> None:
        self._hold_timer = False
        self.flush_held()

    def flush_held(self) -> None:
        """Write the frames held for a batch now (any thread)."""
        with self.lock:
            hold = self._hold
            if not hold or self._conn.closed:
                return
            frames = hold[:]
            hold.clear()
            self._batching.held.discard(self)
            self._hold_epoch = -1
            if self.backlog:
                self._queue_locked(_snapshot(frames))
                return
            self._write_now_locked(frames)

    def _write_now_locked(self, parts: list[Any]) -> None:
        """Write ``parts`` to the socket now; queue what it does not take (lock held)."""
        try:
            sent = self._write(parts) if len(parts) <= _MAX_IOV else 0
        except _WOULD_BLOCK:
            sent = 0
        except OSError:
            # The reader will notice too; keep the frame so nothing is silently lost.
            self._queue_locked(_snapshot(parts))
            self._arm_writer_locked()
            return
        if sent == _total(parts):
            return
        self._queue_locked(_owned(_skip(_views(parts), sent)))
        self._arm_writer_locked()

    def _queue_locked(self, views: list[memoryview]) -> None:
        self.backlog.extend(views)
        n = _nbytes(views)
        self.queued += n
        self._in += n

    def want_drain(self, below: int) -> None:
        """Call ``on_drained()`` (I/O thread) once the backlog is at most ``below`` bytes."""
        with self.lock:
            if self.drain_below < 0 or below < self.drain_below:
                self.drain_below = below

    def _arm_writer_locked(self) -> None:
        if self._writer_armed:
            return
        self._writer_armed = True
        if _on_loop_thread(self._loop):
            self._sel_op(self._loop.add_writer, self._fd, self._on_writable)
        else:
            self._loop.call_soon_threadsafe(self._add_writer)

    def _add_writer(self) -> None:
        if not self._conn.closed:
            self._sel_op(self._loop.add_writer, self._fd, self._on_writable)

    def _on_writable(self) -> None:
        err: BaseException | None = None
        backlog = self.backlog
        left: list[Callable[[], None]] = []
        with self.lock:
            while backlog:
                batch = list(_take(backlog, _MAX_IOV))
                try:
                    sent = self._write(batch)
                except _WOULD_BLOCK:
                    break
                except OSError as e:
                    err = e
                    break
                rest = list(_skip(batch, sent))
                for _ in batch:
                    backlog.popleft()
                backlog.extendleft(reversed(rest))
                self.queued -= sent
                self._out += sent
                if rest:
                    break
            else:
                self._writer_armed = False
                self._sel_op(self._loop.remove_writer, self._fd)
            marks = self._marks
            while marks and marks[0][0] <= self._out:
                left.append(marks.popleft()[1])
            drained = err is None and self.drain_below >= 0 and self.queued <= self.drain_below
            if drained:
                self.drain_below = -1
        for fn in left:
            fn()
        if err is not None:
            self._conn._fail(PeerBrokenError(f"write failed: {err}"), cause=err)
        elif drained and self.on_drained is not None:
            self.on_drained()

    def _write(self, parts: list[Any]) -> int:
        """Write as much of ``parts`` as the socket takes now; returns the bytes written."""
        if not self._tls:
            n = self._sock.sendmsg(parts)
            self._stats.bytes_sent += n
            return n
        sent = 0
        for p in parts:
            view = memoryview(p).cast("B")
            try:
                n = self._sock.send(view)
            except _WOULD_BLOCK:
                if sent:
                    return sent
                raise
            sent += n
            if n < len(view):
                break
        self._stats.bytes_sent += sent
        return sent


class FrameReader:
    """The read side on the I/O thread: the decoder that parses incoming bytes into
    frames for ``on_frame``, the frames read and not yet delivered, who paused
    reading, and the thread that receives a large frame off the loop."""

    __slots__ = (
        "_conn",
        "_direct",
        "_fd",
        "_loop",
        "_max_frame",
        "_on_frame",
        "_rlock",
        "_sock",
        "_stats",
        "_tls",
        "decoder",
        "held_frames",
        "paused_by",
        "thread",
    )

    def __init__(
        self,
        conn: Connection,
        on_frame: Callable[[Connection, Frame], None],
        max_frame: int | None,
        stats: ConnStats,
        direct: DirectReader,
        *,
        decode: bool,
    ) -> None:
        self._conn = conn
        self._sock = conn.sock
        self._loop = conn.loop
        self._fd = conn.fd
        self._tls = conn.tls
        self._on_frame = on_frame
        self._max_frame = max_frame
        self._stats = stats
        self._direct = direct
        self._rlock = direct.rlock  # the read role, taken per wake-up: cached here
        # An unauthenticated peer gets no decode buffer (256 KiB and up) of its own.
        self.decoder: FrameDecoder | None = self.new_decoder() if decode else None
        self.paused_by: set[Hashable] = set()  # who asked us to stop reading (see pause())
        self.held_frames: collections.deque[Frame] = collections.deque()  # read, not delivered
        self.thread: threading.Thread | None = None  # receiving a large frame off the loop

    def new_decoder(self, **kw: Any) -> FrameDecoder:
        # A TLS socket is only ever read by the I/O thread: no hand-off of large frames.
        handoff = 0 if self._tls else config.get("recv_thread_min")
        return FrameDecoder(self._max_frame, handoff_min=handoff, **kw)

    def pause(self, who: Hashable) -> None:
        """Stop reading until every ``who`` that paused has resumed (I/O thread).

        Frames already read are still delivered. While paused, the peer's
        writes back up in the kernel and then in the peer's own backlog.
        """
        if self._conn.closed:
            return
        if not self.paused_by:
            self._direct.sel_op(self._loop.remove_reader, self._fd)
        self.paused_by.add(who)

    def resume(self, who: Hashable) -> None:
        """Undo ``pause(who)`` (I/O thread); reading starts again when nobody holds it."""
        if who not in self.paused_by:
            return
        self.paused_by.discard(who)
        conn = self._conn
        if self.paused_by or conn.closed:
            return
        conn.last_recv = self._loop.time()  # we stopped listening; the peer did not go quiet
        self._direct.sel_op(self._loop.add_reader, self._fd, conn._on_readable)
        self._loop.call_soon(conn._on_readable)  # bytes TLS decrypted already wake no reader

    def on_readable(self) -> None:
        if not self._rlock.acquire(False):
            # A waiting thread reads this connection now: the loop must not spin on it.
            self._direct.mute_if_reading()
            return
        try:
            self._read_on_loop()
        finally:
            self._rlock.release()

    def _read_on_loop(self) -> None:
        conn = self._conn
        if self.paused_by or conn.closed:
            return
        broken = self._direct.broken
        if broken is not None:
            conn._fail(PeerBrokenError(str(broken)), cause=None)
            return
        if conn._tls_pending:
            conn._tls_step()
            return
        if conn._hs is not None and conn._on_handshake_bytes():
            return
        on_frame = self._on_frame
        held = self.held_frames
        while held:
            on_frame(conn, held.popleft())
            if self.paused_by or conn.closed:
                return
        conn.last_recv = self._loop.time()
        decoder = self.decoder
        assert decoder is not None  # made when the handshake succeeded
        if decoder.handoff is not None:
            self._hand_off(decoder)
            return
        sock = self._sock
        stats = self._stats
        for _ in range(_READ_BUDGET):
            buf = decoder.buffer()
            try:
                n = sock.recv_into(buf)
            except _WOULD_BLOCK:
                return
            except OSError as e:
                conn._fail(PeerBrokenError(f"read failed: {e}"), cause=e)
                return
            if n == 0:
                conn._fail(PeerBrokenError("connection closed by peer (EOF)"), cause=None)
                return
            stats.bytes_recv += n
            try:
                frames = decoder.feed(n)
            except PeerBrokenError as e:  # malformed (FrameError) or not authentic (AuthError)
                conn._fail(e, cause=None)
                return
            stats.frames_recv += len(frames)
            for i, f in enumerate(frames):
                if conn.closed:
                    return
                on_frame(conn, f)
                if self.paused_by:
                    # Read already (at most one read's worth): delivered on resume, in order.
                    held.extend(frames[i + 1 :])
                    return
            if decoder.handoff is not None:
                if not conn.closed:
                    self._hand_off(decoder)
                return
            if n < len(buf) and not (self._tls and sock.pending()):  # type: ignore[attr-defined]
                return

    # -- large frames, received off the I/O loop ------------------------------

    def _hand_off(self, decoder: FrameDecoder) -> None:
        """A large frame begins: a thread of its own receives it while the I/O loop
        serves everyone else (I/O thread). The connection pauses until it is in."""
        assert decoder.handoff is not None
        whole, head = decoder.handoff
        decoder.handoff = None
        self.pause(_READER)
        self.thread = threading.Thread(
            target=self._read_large,
            args=(decoder, whole, head),
            name="danaus-recv-large",
            daemon=True,
        )
        self.thread.start()

    def _read_large(self, decoder: FrameDecoder, whole: int, head: bytes) -> None:
        """Receive one large frame straight into its own (warm) memory, check and
        parse it, and hand it to the I/O thread (reader thread)."""
        conn = self._conn
        stats = self._stats
        frame: Frame | None = None
        err: BaseException | None = None
        try:
            try:
                big = recv_pool.take(whole)
            except (MemoryError, OSError, ValueError, OverflowError) as e:
                raise FrameError(f"cannot allocate a frame of {whole} bytes: {e}") from e
            big[: len(head)] = head
            filled = len(head)
            poll = select.poll()
            poll.register(self._fd, select.POLLIN)
            while filled < whole and not conn.closed:
                try:
                    n = self._sock.recv_into(big[filled:])
                except _WOULD_BLOCK:
                    poll.poll(_READER_POLL_MS)
                    continue
                except OSError as e:
                    raise PeerBrokenError(f"read failed: {e}") from e
                if n == 0:
                    raise PeerBrokenError("connection closed by peer (EOF)")
                filled += n
                stats.bytes_recv += n
                stats.recv_off_loop += n
                conn.last_recv = self._loop.time()
            if filled == whole:
                frame = decoder.finish(big)
        except PeerBrokenError as e:  # FrameError, AuthError, a broken socket
            err = e
        except BaseException as e:  # reported on the I/O thread, never lost
            err = PeerBrokenError(f"receiving a large frame failed: {e!r}")
            err.__cause__ = e
        try:
            self._loop.call_soon_threadsafe(self._large_done, frame, err)
        except RuntimeError:  # the loop is closed: the runtime is gone
            conn._release_socket()

    def _large_done(self, frame: Frame | None, err: BaseException | None) -> None:
        """Back on the I/O thread: deliver the frame in order and read on."""
        self.thread = None
        conn = self._conn
        if conn.closed:
            conn._release_socket()
            return
        if err is not None:
            conn._fail(err, cause=None)
            return
        assert frame is not None
        self._stats.frames_recv += 1
        self.held_frames.append(frame)  # delivered first when reading resumes
        self.resume(_READER)


class DirectReader:
    """A thread about to block for a frame on this connection reads it straight off
    the socket (``read_directly``). It owns the read role (held by the I/O thread
    while it reads, or by a waiting thread), the loop's read interest, muted while
    a waiting thread reads, what such a read found for the I/O thread to report
    (a bad frame, EOF), the spin back-off and the waiting threads' poll objects."""

    __slots__ = (
        "_conn",
        "_fd",
        "_loop",
        "_polls",
        "_reader",
        "_sel",
        "_sel_keys",
        "_sock",
        "_spin_backoff",
        "_spin_skip",
        "_stats",
        "active",
        "broken",
        "direct_frame",
        "eof",
        "mu",
        "rlock",
        "unwatched",
    )

    def __init__(self, conn: Connection, stats: ConnStats) -> None:
        self._conn = conn
        self._sock = conn.sock
        self._loop = conn.loop
        self._fd = conn.fd
        self._stats = stats
        self._reader: FrameReader  # set by the connection once the frame reader exists
        # The read role: held by whichever thread reads the socket now, the I/O thread
        # (FrameReader.on_readable) or a waiting one (read_directly).
        self.rlock = threading.Lock()
        # Guards the loop's interest in this socket (its epoll mask), which the I/O
        # thread and a direct reader both change, with ``active`` and ``unwatched``.
        self.mu = threading.Lock()
        self.active = False  # a thread other than the I/O thread reads now
        self.broken: BaseException | None = None  # a direct read found a bad frame
        self.eof = False  # a direct read found EOF or a read error (the loop reports it)
        self.unwatched = False  # _close took the socket out of the loop (under mu)
        # Spinning before a direct read blocks (read_directly; the role holder's):
        # waits to skip spinning, and the skip after the next miss (doubling to a cap).
        self._spin_skip = 0
        self._spin_backoff = 0
        self._sel: selectors.EpollSelector | None = _epoll_of(conn.loop) if not conn.tls else None
        self._sel_keys: dict[int, selectors.SelectorKey] | None = getattr(
            self._sel, "_fd_to_key", None
        )
        self._polls: dict[int, Any] = {}  # the direct reader's poll objects, by bell
        # Set by the runtime: handle a frame on the reading thread; False to leave it to
        # the I/O thread (which then gets it, and everything after it, in order).
        self.direct_frame: Callable[[Connection, Frame], bool] | None = None

    def sel_op(self, fn: Callable[..., Any], *args: Any) -> None:
        """Change the loop's interest in this socket (I/O thread), keeping a direct
        reader's mute: the loop must not watch for reads while another thread reads."""
        with self.mu:
            fn(*args)
            if self.active:
                self._set_interest(False)

    def mute_if_reading(self) -> None:
        """The loop woke for this socket while the role is held: mute it if a waiting
        thread reads (I/O thread)."""
        with self.mu:
            if self.active:
                self._set_interest(False)

    def _set_interest(self, read: bool) -> None:
        """Set the kernel's epoll mask for this socket to what the loop registered,
        without reads unless ``read`` (``mu`` held)."""
        sel = self._sel
        assert sel is not None
        keys = self._sel_keys
        if keys is not None:  # the selector's own table: a dict lookup, not four calls
            key = keys.get(self._fd)
            if key is None:  # not registered now
                return
            events = key.events
        else:  # pragma: no cover - a selector without the table
            try:
                events = sel.get_key(self._fd).events
            except (KeyError, ValueError, RuntimeError):  # not registered now, or loop closed
                return
        mask = 0
        if read and events & selectors.EVENT_READ:
            mask |= select.EPOLLIN
        if events & selectors.EVENT_WRITE:
            mask |= select.EPOLLOUT
        try:
            sel._selector.modify(self._fd, mask)  # type: ignore[attr-defined]
        except (OSError, ValueError):  # gone from the set, or the epoll object closed
            pass

    def read_directly(self, done: Callable[[], bool], timeout: float, bell: int = -1) -> bool:
        """Read this connection on the calling thread, for up to ``timeout`` s, until
        ``done()`` (any thread but the I/O thread).

        A thread about to block for a reply that will come on this connection
        reads it itself: the I/O thread is neither woken nor handed anything,
        which saves two thread wake-ups per round trip. Each frame read goes
        to ``direct_frame``; the first one it declines, and every frame after
        it, goes to the I/O thread in order. ``bell`` is a descriptor that
        ends the wait when readable (the caller drains it). Returns False,
        having done nothing, when the role cannot be taken (the I/O thread is
        reading, the connection is TLS, paused, closing, receiving a large
        frame...): the caller then waits the usual way.

        Before it blocks, the reader polls without blocking for up to
        ``spin_wait`` s: an answer that comes that soon is read by a thread
        that never slept, which on a virtual machine saves the wake-up and the
        cold caches after it (see ``_spin_for``).
        """
        if not self._take_role():
            return False
        try:
            poll = self._polls.get(bell)  # the role holder's alone: no lock needed
            if poll is None:
                if len(self._polls) >= 8:  # readers come and go (actors' bells)
                    self._polls.clear()
                poll = self._polls[bell] = select.poll()
                poll.register(self._fd, select.POLLIN)
                if bell >= 0:
                    poll.register(bell, select.POLLIN)
            now = time.monotonic()
            deadline = now + timeout
            spin = min(self._spin_for(), timeout)
            spin_end = now + spin if spin > 0 else 0.0
            hit = False
            while not done():
                if spin_end:
                    ready = poll.poll(0)
                    if not ready:
                        if time.monotonic() < spin_end:
                            continue
                        spin_end = 0.0
                        continue
                    hit = True
                    spin_end = 0.0
                else:
                    wait_ms = max(0, int((deadline - time.monotonic()) * 1000))
                    ready = poll.poll(wait_ms)
                    if not ready or wait_ms == 0:
                        break
                if any(fd == bell for fd, _ in ready) or self._read_once():
                    break
            if spin > 0:
                self._spun(hit, time.monotonic() - now, spin)
        finally:
            self._give_role()
        return True

    def _spin_for(self) -> float:
        """How long this direct read polls before it blocks (the role holder's).

        Spinning pays when the answer comes within ``spin_wait``. When the
        wait lasted more than ``_SPIN_NEAR`` times the spin (a peer doing real
        work), the next waits skip spinning, 1, 2, 4 ... up to
        ``_SPIN_SKIP_MAX`` of them, so such a peer costs at most one spin in
        65 waits; a hit starts again from no skip. A nearer miss does not
        skip: the peer was only slow to wake, and if both ends stopped
        spinning for that, both would stay slow to wake, each waiting longer
        than the other spins, for good.
        """
        if self._spin_skip:
            self._spin_skip -= 1
            return 0.0
        spin: float = config.get("spin_wait")
        return spin if _SPIN_OK else 0.0

    def _spun(self, hit: bool, waited: float, spin: float) -> None:
        """Account for one spin (the role holder's): ``waited`` s in all."""
        if hit:
            self._stats.spins_hit += 1
            self._spin_backoff = 0
            return
        self._stats.spins_missed += 1
        if waited > _SPIN_NEAR * spin:
            self._spin_skip = self._spin_backoff = min(2 * self._spin_backoff or 1, _SPIN_SKIP_MAX)

    def _take_role(self) -> bool:
        """Become this connection's reader, muting the loop's reads (False: cannot)."""
        if self._sel is None or self.direct_frame is None or not self.rlock.acquire(False):
            return False
        conn = self._conn
        reader = self._reader
        with self.mu:
            if (
                conn.closed
                or self.unwatched
                or reader.paused_by
                or reader.held_frames
                or conn._hs is not None
                or self.broken is not None
                or self.eof
                or reader.decoder is None
                or reader.decoder.handoff is not None
            ):
                self.rlock.release()
                return False
            self.active = True
            self._set_interest(False)
        return True

    def _give_role(self) -> None:
        """Stop being the reader; the loop watches the socket again."""
        try:
            with self.mu:
                self.active = False
                if self.unwatched:
                    self._conn._release_socket()  # _close left it to us
                else:
                    self._set_interest(True)
        finally:
            self.rlock.release()
        reader = self._reader
        if (
            reader.held_frames
            or self.broken is not None
            or self.eof
            or (reader.decoder is not None and reader.decoder.handoff is not None)
        ):
            # Left for the I/O thread, asked only now that it can take the role (an
            # earlier try may have found it still held, and nothing else wakes it).
            self._wake_loop()

    def _read_once(self) -> bool:
        """One read as the direct reader; True when the I/O thread must take over."""
        reader = self._reader
        decoder = reader.decoder
        direct_frame = self.direct_frame
        assert decoder is not None and direct_frame is not None
        conn = self._conn
        if conn.closed:
            return True
        try:
            n = self._sock.recv_into(decoder.buffer())
        except _WOULD_BLOCK:
            return False
        except OSError:
            self.eof = True  # the I/O thread reads the same error and closes
            return True
        if n == 0:
            self.eof = True  # left for the I/O thread to see and report
            return True
        stats = self._stats
        stats.bytes_recv += n
        conn.last_recv = self._loop.time()
        try:
            frames = decoder.feed(n)
        except PeerBrokenError as e:  # the I/O thread closes the connection
            self.broken = e
            return True
        stats.frames_recv += len(frames)
        declined = False
        for f in frames:
            if declined or conn.closed or not direct_frame(conn, f):
                declined = True
                reader.held_frames.append(f)  # the I/O thread delivers it first, in order
            else:
                stats.frames_direct += 1
        return declined or decoder.handoff is not None

    def _wake_loop(self) -> None:
        """Have the I/O thread read this connection soon (held frames, a large frame)."""
        try:
            self._loop.call_soon_threadsafe(self._conn._on_readable)
        except RuntimeError:  # the loop is closed: the runtime is gone
            pass


class _Send(Protocol):
    """The signature of ``WriteBatcher.send`` (bound as ``Connection.send``)."""

    def __call__(
        self, parts: list[Any], on_left: Callable[[], None] | None = ..., *, copy: bool = ...
    ) -> None: ...


class Connection:
    """One end of a framed connection. Create on the I/O thread, use from anywhere.

    It coordinates its parts and owns what they share: the socket, the TLS and
    secret handshakes, the peer's identity, ``closed`` and closing. The parts:
    ``writer`` (:class:`WriteBatcher`), ``reader`` (:class:`FrameReader`),
    ``direct`` (:class:`DirectReader`) and ``stats`` (:class:`ConnStats`). Their
    hot entry points (``send``, ``read_directly``...) are bound here once.
    """

    # Bound in __init__ to the part that does the work (no extra call per frame).
    send: _Send
    flush_held: Callable[[], None]
    want_drain: Callable[[int], None]
    pause: Callable[[Hashable], None]
    resume: Callable[[Hashable], None]
    read_directly: Callable[..., bool]
    _on_readable: Callable[[], None]
    _sel_op: Callable[..., None]

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
        self._tls_pending = False
        if tls is not None:
            # TLS first (non-blocking, driven by the loop), then the secret's handshake
            # inside it. SSL sockets have no sendmsg: frames are written part by part.
            sock = tls.wrap_socket(sock, server_side=server_side, do_handshake_on_connect=False)
            self._tls_pending = True
        self.tls = tls is not None
        self.sock = sock
        self.loop = loop
        self.fd = sock.fileno()
        self._on_close = on_close
        self._on_authenticated = on_authenticated
        self._flush_deadline: float | None = None
        self.closed = False  # set under writer.lock
        self.close_exc: BaseException | None = None
        self.peer: Any = None  # set by the runtime after the hello frame
        self.last_recv = loop.time()
        self.tcp = False  # set by the runtime: TCP (to another host) or Unix (this host)
        self.peer_pid: int | None = None  # the peer's pid, when it is on this host
        # Until the handshake is done, nothing is decoded and nothing is sent but it.
        self._hs = handshake
        self._hs_buf = b""
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
        )
        self.send = writer.send
        self.flush_held = writer.flush_held
        self.want_drain = writer.want_drain
        self.pause = reader.pause
        self.resume = reader.resume
        self.read_directly = direct.read_directly
        self._on_readable = reader.on_readable
        self._sel_op = direct.sel_op
        if handshake is not None:
            if handshake_timeout is None:
                handshake_timeout = config.get("handshake_timeout")
            loop.call_later(handshake_timeout, self._handshake_deadline, handshake_timeout)
        loop.add_reader(self.fd, self._on_readable)
        if self._tls_pending:
            loop.call_soon(self._tls_step)
        else:
            self._start_handshake()

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

    @property
    def frames_sent(self) -> int:
        return self.stats.frames_sent

    @property
    def bytes_sent(self) -> int:
        return self.stats.bytes_sent

    @property
    def frames_recv(self) -> int:
        return self.stats.frames_recv

    @property
    def bytes_recv(self) -> int:
        return self.stats.bytes_recv

    @property
    def recv_off_loop(self) -> int:
        return self.stats.recv_off_loop

    @property
    def frames_direct(self) -> int:
        return self.stats.frames_direct

    @property
    def spins_hit(self) -> int:
        return self.stats.spins_hit

    @property
    def spins_missed(self) -> int:
        return self.stats.spins_missed

    # -- TLS and the secret's handshake (I/O thread) --------------------------------

    def _start_handshake(self) -> None:
        if self._hs is not None:
            first = self._hs.start()
            if first:
                self._raw_send(first)
        else:
            self.writer.start()

    def _tls_step(self) -> None:
        """Advance the TLS handshake (I/O thread)."""
        if self.closed or not self._tls_pending:
            return
        try:
            self.sock.do_handshake()  # type: ignore[attr-defined]
        except ssl.SSLWantReadError:
            self._tls_writer(False)
            return
        except ssl.SSLWantWriteError:
            self._tls_writer(True)
            return
        except OSError as e:
            if e.errno in (errno.ENOTCONN, errno.EAGAIN):  # the TCP connect is in progress
                self._tls_writer(True)
                return
            self._fail(PeerBrokenError(f"TLS handshake failed: {e}"), cause=e)
            return
        self._tls_pending = False
        self._tls_writer(False)
        self._start_handshake()

    def _tls_writer(self, on: bool) -> None:
        if on:
            self.loop.add_writer(self.fd, self._tls_step)
        else:
            self.loop.remove_writer(self.fd)

    @property
    def authenticated(self) -> bool:
        return self._hs is None

    def _raw_send(self, data: bytes) -> None:
        try:
            self.sock.send(data)  # a few dozen bytes into a fresh socket: fits the buffer
        except OSError as e:
            self._fail(PeerBrokenError(f"handshake write failed: {e}"), cause=e)

    def _handshake_deadline(self, timeout: float) -> None:
        if self._hs is not None and not self.closed:
            self._fail(PeerBrokenError(f"no handshake within {timeout} s"), cause=None)

    def _on_handshake_bytes(self) -> bool:
        """Advance the handshake; True while it is still in progress."""
        hs = self._hs
        assert hs is not None
        try:
            chunk = self.sock.recv(hs.want() - len(self._hs_buf))
        except _WOULD_BLOCK:
            return True
        except OSError as e:
            self._fail(PeerBrokenError(f"read failed during handshake: {e}"), cause=e)
            return True
        if not chunk:
            self._fail(PeerBrokenError("connection closed during the handshake"), cause=None)
            return True
        self.last_recv = self.loop.time()
        self._hs_buf += chunk
        if len(self._hs_buf) < hs.want():
            return True
        data, self._hs_buf = self._hs_buf, b""
        try:
            out = hs.feed(data)
        except PeerBrokenError as e:
            self._fail(e, cause=None)
            return True
        if out:
            self._raw_send(out)
        if not hs.done:
            return True
        session = None if self.tls else hs.session()  # TLS protects every byte already
        if session is not None:
            self.reader.decoder = self.reader.new_decoder(trailer=TAG, check=session.check)
        else:
            self.reader.decoder = self.reader.new_decoder()
        self.writer.authenticated(session)
        self._hs = None
        if self._on_authenticated is not None:
            self._on_authenticated(self)
        return False

    def _release_socket(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    # -- closing ------------------------------------------------------------

    def _fail(self, exc: BaseException, cause: BaseException | None) -> None:
        if cause is not None:
            exc.__cause__ = cause
        if isinstance(exc, (FrameError, AuthError)) and self._hs is None and not self.closed:
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
            self._sel_op(self.loop.remove_reader, self.fd)
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


def _epoll_of(loop: asyncio.AbstractEventLoop) -> selectors.EpollSelector | None:
    """The loop's epoll selector, when it has one that other threads may adjust."""
    sel = getattr(loop, "_selector", None)
    return sel if isinstance(sel, selectors.EpollSelector) else None


def _on_loop_thread(loop: asyncio.AbstractEventLoop) -> bool:
    tid = getattr(loop, "_thread_id", _NO_TID)  # asyncio's base loop records its thread
    if tid is not _NO_TID:
        return tid == threading.get_ident()
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


_NO_TID = object()
_READER = "large frame"  # what pauses a connection while a thread receives a large frame
_READER_POLL_MS = 200  # a reader thread waiting for bytes looks at `closed` this often


def _total(parts: list[Any]) -> int:
    n = 0
    for p in parts:
        n += len(p) if type(p) is bytes else memoryview(p).nbytes
    return n


def _snapshot(parts: list[Any]) -> list[memoryview]:
    """``_owned(_views(parts))``, with no cast or copy for ``bytes`` parts."""
    out = []
    for p in parts:
        if type(p) is bytes:
            out.append(memoryview(p))
        else:
            v = memoryview(p).cast("B")
            out.append(v if isinstance(v.obj, bytes) else memoryview(bytes(v)))
    return out


def _views(parts: list[Any]) -> list[memoryview]:
    return [memoryview(p).cast("B") for p in parts]


def _owned(views: list[memoryview]) -> list[memoryview]:
    """``views`` that will be written after ``send()`` returns, as a snapshot.

    The caller may change an array it sent as soon as ``send()`` returns
    (Monarch pickles at call time), so bytes not yet written are copied once
    here, unless they are immutable ``bytes`` already. A frame written at once
    (the common case) is never copied.
    """
    return [v if isinstance(v.obj, bytes) else memoryview(bytes(v)) for v in views]


def _nbytes(views: list[memoryview]) -> int:
    return sum(v.nbytes for v in views)


def _skip(views: list[memoryview], n: int) -> list[memoryview]:
    out = []
    for v in views:
        if n >= len(v):
            n -= len(v)
            continue
        out.append(v[n:] if n else v)
        n = 0
    return out


def _take(dq: collections.deque[memoryview], k: int) -> list[memoryview]:
    out = []
    for v in dq:
        out.append(v)
        if len(out) == k:
            break
    return out
