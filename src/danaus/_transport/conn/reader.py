"""The read side of one connection on the I/O thread: decoding, delivery, pauses,
and large frames received off the loop."""

from __future__ import annotations

import collections
import select
import threading
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any

from ... import _config as config
from ..._errors import PeerBrokenError
from ..._wire.frame import Frame, FrameDecoder, FrameError, recv_pool
from .buffers import WOULD_BLOCK
from .core import ConnCore, Part
from .stats import ConnStats

if TYPE_CHECKING:
    from .direct import DirectReader

_READ_BUDGET = 64  # reads per wakeup before yielding to other connections
_READER = "large frame"  # what pauses a connection while a thread receives a large frame
_READER_POLL_MS = 200  # a reader thread waiting for bytes looks at `closed` this often


class FrameReader(Part):
    """The read side on the I/O thread: the decoder that parses incoming bytes into
    frames for ``on_frame``, the frames read and not yet delivered, who paused
    reading, and the thread that receives a large frame off the loop."""

    __slots__ = (
        "_direct",
        "_max_frame",
        "_on_frame",
        "_rlock",
        "decoder",
        "held_frames",
        "paused_by",
        "thread",
    )

    def __init__(
        self,
        conn: ConnCore,
        on_frame: Callable[[Any, Frame], None],  # (the Connection, a frame)
        max_frame: int | None,
        stats: ConnStats,
        direct: DirectReader,
        *,
        decode: bool,
    ) -> None:
        super().__init__(conn, stats)
        self._on_frame = on_frame
        self._max_frame = max_frame
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
        conn.last_recv = self._now()  # we stopped listening; the peer did not go quiet
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
        opening = conn.opening
        if opening is not None and opening.on_readable():
            return
        on_frame = self._on_frame
        held = self.held_frames
        while held:
            on_frame(conn, held.popleft())
            if self.paused_by or conn.closed:
                return
        conn.last_recv = self._now()
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
            except WOULD_BLOCK:
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
                except WOULD_BLOCK:
                    poll.poll(_READER_POLL_MS)
                    continue
                except OSError as e:
                    raise PeerBrokenError(f"read failed: {e}") from e
                if n == 0:
                    raise PeerBrokenError("connection closed by peer (EOF)")
                filled += n
                stats.bytes_recv += n
                stats.recv_off_loop += n
                conn.last_recv = self._now()
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
