"""The write side of one connection: the backlog, the held batch, flushing."""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import Any

from ... import _config as config
from ..._errors import ConnectionClosedError, PeerBrokenError, TransportError
from ..auth import TAG, Session
from .batching import Batching
from .buffers import (
    MAX_IOV,
    WOULD_BLOCK,
    as_views,
    owned_views,
    skip_bytes,
    snapshot,
    take_views,
    total_bytes,
    view_bytes,
)
from .core import ConnCore, Part
from .loop import _on_loop_thread
from .stats import ConnStats

_HOLD_MAX = 16 << 10  # frames up to this size (one bytes part) may be held for a batch


def _closed_error(conn: ConnCore) -> TransportError:
    """What a send on the closed ``conn`` raises: why it closed, when that is a transport
    error (the peer broke), else that it is closed."""
    exc = conn.close_exc
    return exc if isinstance(exc, TransportError) else ConnectionClosedError("connection is closed")


class WriteBatcher(Part):
    """The write side of one connection (any thread). It owns the backlog that
    waits for the socket and its byte count, the frames sent before the session
    key exists, the session that seals frames, the small frames held for one
    batched write (and their timer), the drain watermark, and the writer's
    registration with the loop."""

    __slots__ = (
        "_batching",
        "_hold",
        "_hold_epoch",
        "_hold_timer",
        "_in",
        "_marks",
        "_opening",
        "_out",
        "_sealing",
        "_sel_op",
        "_session",
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
        conn: ConnCore,
        batching: Batching,
        stats: ConnStats,
        sel_op: Callable[..., None],
        *,
        sealing: bool,
        opening: bool,
    ) -> None:
        super().__init__(conn, stats)
        self._sel_op = sel_op
        self._batching = batching
        # Guards what this class owns (backlog, byte count, unsealed frames, session,
        # held batch) and the connection's ``closed`` flag, which ``_close`` sets under it.
        self.lock = threading.Lock()
        self.backlog: collections.deque[memoryview] = collections.deque()
        self.queued = 0  # bytes in backlog and _unsealed: what waits to be written
        self._sealing = sealing  # the handshake is not done: frames wait in _unsealed
        self._opening = opening  # TLS's handshake is not done: nothing is written yet
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
        with self.lock:
            self._opening = False
            if self.backlog:
                self._arm_writer_locked()

    def authenticated(self, session: Session | None) -> None:
        """The handshake succeeded (I/O thread): seal with ``session`` from now on and
        queue, sealed, what was sent before."""
        with self.lock:
            self._sealing = self._opening = False
            self._session = session
            for parts, on_left in self._unsealed:
                views = as_views(self._sealed(parts))
                self.backlog.extend(views)
                self._in += view_bytes(views)
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

        Raises `TransportError` if the connection is already closed (then
        ``on_left`` is not called).
        """
        if on_left is not None:
            self._send_large(parts, on_left, copy)
            return
        with self.lock:
            conn = self._conn
            if conn.closed:
                raise _closed_error(conn)
            self._stats.frames_sent += 1
            now = self._now()
            last, self.last_send = self.last_send, now
            if self._sealing:
                # Sealed once the handshake gives the key; a snapshot, since the caller
                # may change its arrays as soon as we return.
                owned = owned_views(as_views(parts))
                self._unsealed.append((owned, None))
                self.queued += view_bytes(owned)
                return
            if self._session is not None:
                parts = self._sealed(parts)
            if self.backlog or self._opening:
                self._queue_locked(snapshot(parts))
                return
            hold = self._hold
            batching = self._batching
            if hold or (
                now - last < config.values.send_batch_delay and self._hold_epoch == batching.epoch
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
                self._queue_locked(snapshot(parts))
                self._arm_writer_locked()
                return
            window = config.values.coalesce_window
            if window > 0 and now - last < window and not _on_loop_thread(self._loop):
                # Frames are coming in a burst: let the I/O thread write them together
                # (one syscall, one wake-up of the peer) instead of one by one.
                self._queue_locked(snapshot(parts))
                self._arm_writer_locked()
                return
            self._write_now_locked(parts)

    def _send_large(self, parts: list[Any], on_left: Callable[[], None], copy: bool) -> None:
        """``send`` of a frame whose sender hears when it has left: what is not written
        at once is queued as views (or, with ``copy``, a snapshot), ``on_left`` at its end."""
        with self.lock:
            conn = self._conn
            if conn.closed:
                raise _closed_error(conn)
            self._stats.frames_sent += 1
            self.last_send = self._now()
            if self._sealing:
                kept = owned_views(as_views(parts)) if copy else parts
                self._unsealed.append((kept, on_left))
                self.queued += total_bytes(kept)
                return
            if self._session is not None:
                parts = self._sealed(parts)
            views = as_views(parts)
            hold = self._hold
            if hold:  # what is held goes first
                views = as_views(hold) + views
                hold.clear()
                self._batching.held.discard(self)
            sent = 0
            if (
                not self.backlog
                and not self._opening
                and (not self._tls or _on_loop_thread(self._loop))
            ):
                try:
                    sent = self._write(views) if len(views) <= MAX_IOV else 0
                except WOULD_BLOCK:
                    sent = 0
                except OSError:
                    sent = 0  # the reader will notice too; the bytes stay queued
            rest = skip_bytes(views, sent)
            if not rest:
                done = True
            else:
                done = False
                self._queue_locked(owned_views(rest) if copy else rest)
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
        batch = config.values.send_batch
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
        self._loop.call_later(config.values.send_batch_delay, self._hold_timer_fired)

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
                self._queue_locked(snapshot(frames))
                return
            self._write_now_locked(frames)

    def _write_now_locked(self, parts: list[Any]) -> None:
        """Write ``parts`` to the socket now; queue what it does not take (lock held)."""
        try:
            sent = self._write(parts) if len(parts) <= MAX_IOV else 0
        except WOULD_BLOCK:
            sent = 0
        except OSError:
            # The reader will notice too; keep the frame so nothing is silently lost.
            self._queue_locked(snapshot(parts))
            self._arm_writer_locked()
            return
        if sent == total_bytes(parts):
            return
        self._queue_locked(owned_views(skip_bytes(as_views(parts), sent)))
        self._arm_writer_locked()

    def _queue_locked(self, views: list[memoryview]) -> None:
        self.backlog.extend(views)
        n = view_bytes(views)
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
                batch = list(take_views(backlog, MAX_IOV))
                try:
                    sent = self._write(batch)
                except WOULD_BLOCK:
                    break
                except OSError as e:
                    err = e
                    break
                rest = list(skip_bytes(batch, sent))
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
            except WOULD_BLOCK:
                if sent:
                    return sent
                raise
            sent += n
            if n < len(view):
                break
        self._stats.bytes_sent += sent
        return sent
