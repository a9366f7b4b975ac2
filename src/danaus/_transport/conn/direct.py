"""A waiting thread's reads of one connection (``read_directly``) and its spins."""

from __future__ import annotations

import collections
import os
import select
import selectors
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any, Protocol

from ... import _config as config
from ..._errors import PeerBrokenError
from ..._wire.frame import Frame, FrameDecoder
from .buffers import WOULD_BLOCK
from .core import ConnCore, Part
from .loop import _epoll_of
from .stats import ConnStats

# One CPU: a spinning reader only delays the peer it waits for.
_SPIN_OK = len(os.sched_getaffinity(0)) > 1 if hasattr(os, "sched_getaffinity") else False
_SPIN_SKIP_MAX = 64  # waits without spinning after repeated misses, at most
_SPIN_NEAR = 3  # a miss whose wait was at most this many spins long does not skip


class ReadState(Protocol):
    """What a direct read checks and leaves of the I/O thread's read side
    (``FrameReader``): who paused it, the frames it has not delivered, its decoder."""

    paused_by: set[Hashable]
    held_frames: collections.deque[Frame]
    decoder: FrameDecoder | None


class DirectReader(Part):
    """A thread about to block for a frame on this connection reads it straight off
    the socket (``read_directly``). It owns the read role (held by the I/O thread
    while it reads, or by a waiting thread), the loop's read interest, muted while
    a waiting thread reads, what such a read found for the I/O thread to report
    (a bad frame, EOF), the spin back-off and the waiting threads' poll objects."""

    __slots__ = (
        "_polls",
        "_reader",
        "_sel",
        "_sel_keys",
        "_spin_backoff",
        "_spin_skip",
        "active",
        "broken",
        "direct_frame",
        "eof",
        "mu",
        "rlock",
        "unwatched",
    )

    def __init__(self, conn: ConnCore, stats: ConnStats) -> None:
        super().__init__(conn, stats)
        self._reader: ReadState  # set by the connection once the frame reader exists
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
        self.direct_frame: Callable[[Any, Frame], bool] | None = None

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

    def read_directly(
        self, done: Callable[[], bool], timeout: float, bell: int = -1
    ) -> bool | None:
        """Read this connection on the calling thread, for up to ``timeout`` s, until
        ``done()`` (any thread but the I/O thread); returns whether ``done()`` held
        when it stopped.

        A thread about to block for a reply that will come on this connection
        reads it itself: the I/O thread is neither woken nor handed anything,
        which saves two thread wake-ups per round trip. Each frame read goes
        to ``direct_frame``; the first one it declines, and every frame after
        it, goes to the I/O thread in order. ``bell`` is a descriptor that
        ends the wait when readable (the caller drains it). Returns None,
        having done nothing, when the role cannot be taken (the I/O thread is
        reading, the connection is TLS, paused, closing, receiving a large
        frame...): the caller then waits the usual way.

        Before it blocks, the reader polls without blocking for up to
        ``spin_wait`` s: an answer that comes that soon is read by a thread
        that never slept, which on a virtual machine saves the wake-up and the
        cold caches after it (see ``_spun_missed``).
        """
        if not self._take_role():
            return None
        finished = False
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
            # How long to poll before blocking. Spinning pays when the answer comes
            # within ``spin_wait``; after a wait of more than ``_SPIN_NEAR`` spins (a
            # peer doing real work) the next waits skip it (``_spun_missed``).
            if self._spin_skip:
                self._spin_skip -= 1
                spin = 0.0
            else:
                spin = min(config.values.spin_wait, timeout) if _SPIN_OK else 0.0
            spin_end = now + spin if spin > 0 else 0.0
            hit = False
            # ``done()`` is asked once the role is ours (until then the I/O thread may
            # have read it) and after each read: from now on what the reader waits for
            # comes in a frame read here, or (a failure found by another thread, which
            # closes the connection) with the wake-up that ends the poll.
            finished = done()
            while not finished:
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
                if bell >= 0 and any(fd == bell for fd, _ in ready):
                    break
                if self._read_once():
                    break
                finished = done()
            if spin > 0:
                if hit:
                    self._stats.spins_hit += 1
                    self._spin_backoff = 0
                elif spin < timeout:
                    # Spun for nothing, then slept. (A spin as long as the read, cut
                    # short by the caller's timeout slice, never slept: no miss; the
                    # caller's next read spins on.)
                    self._spun_missed(time.monotonic() - now, spin)
        finally:
            self._give_role()
        return finished

    def _spun_missed(self, waited: float, spin: float) -> None:
        """Account for a spin that missed (the role holder's): ``waited`` s in all.

        When the wait lasted more than ``_SPIN_NEAR`` times the spin (a peer
        doing real work), the next waits skip spinning, 1, 2, 4 ... up to
        ``_SPIN_SKIP_MAX`` of them, so such a peer costs at most one spin in
        65 waits; a hit starts again from no skip. A nearer miss does not
        skip: the peer was only slow to wake, and if both ends stopped
        spinning for that, both would stay slow to wake, each waiting longer
        than the other spins, for good.
        """
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
                or conn.opening is not None
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
        except WOULD_BLOCK:
            return False
        except OSError:
            self.eof = True  # the I/O thread reads the same error and closes
            return True
        if n == 0:
            self.eof = True  # left for the I/O thread to see and report
            return True
        stats = self._stats
        stats.bytes_recv += n
        conn.last_recv = self._now()
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
