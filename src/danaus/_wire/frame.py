"""Frames: the unit a connection carries — a header, a body and out-of-band buffers.

Layout (little-endian)::

    u64 length of everything after this field
    u32 header length  | u32 number of buffers | u64 body length
    u64 length of each buffer
    header bytes (a pickled tuple of builtins, read by a restricted unpickler)
    body bytes   (a pickle-5 stream, decoded later by the receiver of the message)
    buffer bytes (pickle-5 out-of-band buffers, back to back)

``encode_frame`` returns a list of byte-likes for a vectored write (no copy of
the buffers); ``FrameDecoder`` is an incremental decoder that tells its caller
where to read next, so a large frame is received straight into its own
memory and its buffers are views of it (no further copy).
"""

from __future__ import annotations

import io
import mmap
import pickle
import struct
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from .. import _config as config
from .._errors import PeerBrokenError
from . import memory

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer  # bytes, memoryview, PickleBuffer, mmap...

__all__ = [
    "Frame",
    "FrameDecoder",
    "FrameError",
    "WarmPool",
    "alloc",
    "decode_frame",
    "encode_frame",
    "encode_pickled",
    "flat",
]

_PREFIX = struct.Struct("<QIIQ")  # total, header_len, nbufs, body_len
_LEN = struct.Struct("<Q")
_FIXED = _PREFIX.size - 8  # bytes counted in `total` before the buffer lengths

MAX_BUFFERS = 4096
MAX_HEADER = 1 << 20
# The deepest nesting of containers a header may have (danaus's own reach 5); deeper
# ones are refused where decoding starts, before any code walks them recursively.
MAX_HEADER_DEPTH = 32
_STAGING = 256 << 10  # frames smaller than this are parsed out of a shared staging buffer
_PROBE = 16 << 10  # bytes read first after a large frame (see FrameDecoder._after_big)


class FrameError(PeerBrokenError):
    """A frame was malformed, truncated or larger than allowed; the connection is closed."""


# A frame header is a tuple of builtins (ids travel as plain tuples, see
# danaus._wire.protocol). Headers are decoded on the I/O thread before anything
# else looks at a frame, so they must not be able to run code: the unpickler
# resolves no class and no callable at all (``find_class`` refuses everything;
# the extension registry goes through it too), only builtins' own opcodes.


class _HeaderUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"a frame header may not name {module}.{name} (builtins only)")


class Frame(NamedTuple):
    header: tuple[Any, ...]
    body: memoryview
    buffers: list[memoryview]


def encode_frame(
    header: tuple[Any, ...], body: bytes | memoryview = b"", buffers: Sequence[ReadableBuffer] = ()
) -> list[Any]:
    """Encode one frame as a list of byte-likes, ready for ``socket.sendmsg``."""
    return encode_pickled(pickle.dumps(header, protocol=5), body, buffers)


_SMALL_BODY = 4096  # bodies up to this size are joined to the header (one write part)


def encode_pickled(
    h: bytes, body: bytes | memoryview = b"", buffers: Sequence[ReadableBuffer] = ()
) -> list[Any]:
    """``encode_frame`` for a header pickled already (``h`` is the pickle of the header
    tuple); without buffers a small body is joined to it, one part in all."""
    body_len = len(body)
    if not buffers:
        prefix = _PREFIX.pack(_FIXED + len(h) + body_len, len(h), 0, body_len)
        if body_len <= _SMALL_BODY:
            return [prefix + h + body]
        return [prefix + h, body]
    raws = [flat(b) for b in buffers]
    sizes = [len(r) for r in raws]
    lens = struct.pack(f"<{len(sizes)}Q", *sizes)
    total = _FIXED + len(lens) + len(h) + body_len + sum(sizes)
    head = _PREFIX.pack(total, len(h), len(raws), body_len) + lens + h
    if body_len <= _SMALL_BODY:  # one part fewer to write
        parts: list[Any] = [head + body] if body_len else [head]
    else:
        parts = [head, body]
    parts.extend(r for r in raws if len(r))
    return parts


def flat(b: ReadableBuffer) -> bytes | memoryview:
    """A flat byte view of a buffer (empty and n-dimensional buffers included)."""
    if isinstance(b, bytes):
        return b
    if isinstance(b, pickle.PickleBuffer):
        return b.raw()
    m = memoryview(b)
    return m.cast("B") if m.nbytes else b""


def decode_frame(data: bytes | bytearray | memoryview) -> Frame:
    """The one frame ``data`` holds (as ``encode_frame`` wrote it, length prefix
    included); `FrameError` if it is not exactly one well-formed frame."""
    view = memoryview(data)
    if len(view) < 8 or _LEN.unpack_from(view, 0)[0] != len(view) - 8:
        raise FrameError(f"not one whole frame: {len(view)} bytes")
    return _parse(view[8:])


_COUNTS = struct.Struct("<IIQ")  # header_len, nbufs, body_len


def _parse(frame: memoryview) -> Frame:
    """Parse one complete frame (``frame`` excludes the leading u64 length)."""
    header_len, nbufs, body_len = _COUNTS.unpack_from(frame, 0)
    if nbufs == 0 and header_len <= MAX_HEADER and _FIXED + header_len + body_len == len(frame):
        # Most frames (every call and reply of plain data): no buffer table to read.
        pos = _FIXED + header_len
        return _tn(Frame, (_header(frame[_FIXED:pos]), frame[pos:], []))
    if nbufs > MAX_BUFFERS or header_len > MAX_HEADER:
        raise FrameError(f"frame announces {nbufs} buffers and a {header_len}-byte header")
    pos = _FIXED
    end_lens = pos + 8 * nbufs
    if end_lens > len(frame):
        raise FrameError("frame too short for its buffer table")
    lens = [_LEN.unpack_from(frame, pos + 8 * i)[0] for i in range(nbufs)]
    pos = end_lens
    if pos + header_len + body_len + sum(lens) != len(frame):
        raise FrameError(
            f"frame lengths do not add up: {len(frame)} bytes for header {header_len}, "
            f"body {body_len}, buffers {lens}"
        )
    header = _header(frame[pos : pos + header_len])
    pos += header_len
    body = frame[pos : pos + body_len]
    pos += body_len
    bufs = []
    for n in lens:
        bufs.append(frame[pos : pos + n])
        pos += n
    return _tn(Frame, (header, body, bufs))


def _header(raw: memoryview) -> tuple[Any, ...]:
    """The header tuple, through the restricted unpickler; ``FrameError`` if it is not one
    (a header nesting deeper than ``MAX_HEADER_DEPTH`` included)."""
    data = bytes(raw)
    try:
        header = _HeaderUnpickler(io.BytesIO(data)).load()
    except BaseException as e:  # SystemExit, RecursionError ...: this connection only
        if isinstance(e, KeyboardInterrupt):
            raise
        raise FrameError(f"undecodable frame header: {e!r:.200}") from e
    if type(header) is not tuple or not header:
        raise FrameError(f"frame header is not a non-empty tuple: {_short(header)}")
    # Each container a pickle builds takes at least one of these opcodes, so a header
    # with fewer holds fewer containers, and nests no deeper, than that (no walk: the
    # common case). Only a mutable container could contain itself, which ``repr`` and
    # the decoders below take without recursing.
    if len(data) - len(data.translate(None, _CONTAINER_OPS)) > MAX_HEADER_DEPTH:
        problem = _depth_problem(header, MAX_HEADER_DEPTH)
        if problem:
            raise FrameError(f"frame header refused: {problem}")
    return header


# EMPTY_TUPLE, MARK, EMPTY_LIST, EMPTY_DICT, TUPLE1-3, EMPTY_SET: one per container built.
_CONTAINER_OPS = b")(]}\x85\x86\x87\x8f"
_CONTAINERS = (tuple, list, dict, set, frozenset)


def _children(o: Any) -> Iterable[Any]:
    return (*o, *o.values()) if type(o) is dict else o


def _depth_problem(obj: Any, limit: int) -> str:
    """Why ``obj`` may not be a header ("" if it may): nesting deeper than ``limit``, or a
    container inside itself. Walks without recursion, each container once (a shared one
    is not walked again, so sharing cannot make the walk long)."""
    heights: dict[int, int] = {}
    path: set[int] = set()  # the containers entered and not finished: the current path
    stack: list[tuple[Any, bool]] = [(obj, False)]
    while stack:
        o, finished = stack.pop()
        key = id(o)
        if finished:
            path.discard(key)
            h = 1 + max((heights.get(id(c), 0) for c in _children(o)), default=0)
            if h > limit:
                return f"it nests containers deeper than {limit} levels"
            heights[key] = h
            continue
        if key in heights:
            continue
        if key in path:
            return "a container holds itself"
        if len(path) >= limit:
            return f"it nests containers deeper than {limit} levels"
        path.add(key)
        stack.append((o, True))
        stack.extend((c, False) for c in _children(o) if type(c) in _CONTAINERS)
    return ""


def _short(value: Any) -> str:
    """``repr(value)`` cut to 100 characters, or its type where even that fails."""
    try:
        return f"{value!r:.100}"
    except Exception:
        return f"a {type(value).__name__}"


_tn = tuple.__new__  # a NamedTuple's own __new__ is Python code: this is C


def alloc(n: int) -> mmap.mmap | bytearray:
    """Writable memory for a large buffer: a private anonymous mapping with its pages
    faulted in (without holding the GIL: ``memory``), which is faster to fill than a
    zeroed bytearray."""
    if not hasattr(mmap, "MAP_ANONYMOUS"):  # pragma: no cover - not POSIX
        return bytearray(n)
    return memory.anonymous(n)


def _size_class(n: int) -> int:
    """``n`` rounded up to one of 8 steps per power of two (at most 12.5 % more)."""
    step = 1 << max(12, n.bit_length() - 4)
    return -(-n // step) * step


def _refs_of_a_listed_object() -> int:
    """What ``sys.getrefcount`` says of an object held by one list only, while
    ``WarmPool`` looks at it in its loop (a baseline measured, not assumed)."""
    holder = [mmap.mmap(-1, 4096)]
    for m in holder:
        n = sys.getrefcount(m)
    holder[0].close()
    return n


_FREE_REFS = _refs_of_a_listed_object()


def _free_one(maps: Iterable[mmap.mmap | bytearray]) -> mmap.mmap | bytearray | None:
    """A mapping of ``maps`` nothing else refers to, or None."""
    for m in maps:
        if sys.getrefcount(m) <= _FREE_REFS:
            return m
    return None


class WarmPool:
    """Receive memory that stays mapped and faulted in between messages.

    A fresh mapping costs a page fault (and the kernel zeroing a page) for every
    4 KiB, which on a virtual machine costs more than copying the data into it
    (``benchmarks/NOTES.md``). ``take(n)`` returns an ``n``-byte view of a mapping
    that earlier messages used, when one of the right size class is free, else of
    a new one. A mapping is free when nothing but this pool refers to it: every
    view of it (a frame's buffers, a numpy array or tensor built on them, a
    ``memoryview``) holds a reference to the mapping object, so a mapping that user
    code still holds, directly or through any view, is never handed out again.
    The mappings the pool keeps, free or lent, add up to at most ``limit()``
    bytes; a mapping taken when the pool is full is not kept (it is unmapped when
    its last user drops it, as without a pool). Thread-safe.
    """

    def __init__(self, limit: Callable[[], int], smallest: int = 1 << 20) -> None:
        self._limit = limit
        self._smallest = smallest
        self._lock = threading.Lock()  # guards the pool: _maps, kept and its statistics
        # size class -> mappings the pool keeps
        self._maps: dict[int, list[mmap.mmap | bytearray]] = {}
        self.kept = 0  # bytes of the mappings kept
        self.reused = 0  # takes served by a warm mapping (a statistic, for tests)

    def take(self, n: int) -> memoryview:
        if n < self._smallest:
            return memoryview(alloc(n))
        size = _size_class(n)
        with self._lock:
            warm = _free_one(self._maps.get(size, ()))
            if warm is not None:
                self.reused += 1
                return memoryview(warm)[:n]
            limit = self._limit()
            if self.kept + size > limit:
                self._evict(self.kept + size - limit)
            keep = self.kept + size <= limit
        # Outside the lock: populating a big mapping takes a while. One the pool will not
        # keep is made to measure: rounded up, it would cost up to 12.5 % more resident.
        mapping = alloc(size if keep else n)
        if keep:
            with self._lock:
                self._maps.setdefault(size, []).append(mapping)
                self.kept += size
        return memoryview(mapping)[:n]

    def _evict(self, want: int) -> None:
        """Unmap free mappings (largest classes first) until ``want`` bytes are gone."""
        for size in sorted(self._maps, reverse=True):
            maps = self._maps[size]
            for m in list(maps):
                if want <= 0:
                    return
                if sys.getrefcount(m) <= _FREE_REFS + 1:  # + the copy of the list
                    maps.remove(m)
                    self.kept -= size
                    want -= size
                    if isinstance(m, mmap.mmap):  # a bytearray (not POSIX) has nothing to unmap
                        m.close()
            if not maps:
                del self._maps[size]

    def clear(self) -> None:
        """Unmap every free mapping; lent ones are forgotten (they die with their users)."""
        with self._lock:
            self._evict(self.kept)
            self._maps.clear()
            self.kept = 0


#: The receive memory of this process: large frames read from a socket and large
#: buffers copied out of a sender on this host land in it.
recv_pool = WarmPool(lambda: config.get("recv_pool"))


class FrameDecoder:
    """Incremental decoder. Call ``buffer()``, read into it, then ``feed(n)``.

    Raises `FrameError` on malformed input; the caller closes the connection.

    With ``trailer`` > 0 every frame is followed by that many bytes (an
    authentication tag), and ``check(prefix, frame, trailer)`` runs on each
    complete frame *before* its header is parsed; it raises to refuse it.
    """

    def __init__(
        self,
        max_frame: int | None = None,
        *,
        trailer: int = 0,
        check: Callable[[bytes, memoryview, memoryview], None] | None = None,
        handoff_min: int = 0,
    ) -> None:
        self.max_frame = config.get("codec_max_frame_length") if max_frame is None else max_frame
        self.trailer = trailer
        self.check = check
        # Frames of at least this many bytes (0: none) are not received here: feed()
        # stops at them and leaves ``handoff`` = (bytes in all, bytes read already) for
        # a reader of the caller's choosing, which then calls ``finish``.
        self.handoff_min = handoff_min
        self.handoff: tuple[int, bytes] | None = None
        self._staging = bytearray(_STAGING)
        self._start = 0  # first unparsed byte in staging
        self._end = 0  # end of valid bytes in staging
        self._big: memoryview | None = None  # a large frame being received in place
        self._big_filled = 0
        # The last frame was large: the next read into an empty staging buffer takes
        # only _PROBE bytes, so that when the next frame is large too (a stream of
        # arrays) no more than that is copied from staging into its own memory.
        self._after_big = False

    def finish(self, big: memoryview) -> Frame:
        """The frame ``big`` holds, received whole (its length prefix excluded): checked,
        then parsed. Any thread; raises what ``feed`` raises."""
        total = len(big) - self.trailer
        if self.check is not None:
            self.check(_LEN.pack(total), big[:total], big[total:])
        return _parse(big[:total])

    def buffer(self) -> memoryview:
        """The memory the next read should fill."""
        if self._big is not None:
            return self._big[self._big_filled :]
        if self._end == len(self._staging):
            self._compact()
        if self._after_big and self._end == self._start:
            return memoryview(self._staging)[self._end : self._end + _PROBE]
        return memoryview(self._staging)[self._end :]

    def _compact(self) -> None:
        n = self._end - self._start
        if self._start:
            self._staging[:n] = self._staging[self._start : self._end]
        self._start, self._end = 0, n

    def feed(self, n: int) -> list[Frame]:
        """Account for ``n`` bytes just read; return the frames now complete."""
        frames: list[Frame] = []
        if self._big is not None:
            self._big_filled += n
            if self._big_filled < len(self._big):
                return frames
            big, self._big = self._big, None
            self._after_big = True
            frames.append(self.finish(big))
            return frames
        self._end += n
        self._after_big = False
        while True:
            avail = self._end - self._start
            if avail < 8:
                break
            (total,) = _LEN.unpack_from(self._staging, self._start)
            if total > self.max_frame or total < _FIXED:
                raise FrameError(
                    f"frame of {total} bytes refused (allowed: {_FIXED}..{self.max_frame})"
                )
            whole = total + self.trailer
            if avail - 8 >= whole:
                begin = self._start + 8
                if self.check is not None:
                    staged = memoryview(self._staging)
                    self.check(
                        bytes(staged[self._start : begin]),
                        staged[begin : begin + total],
                        staged[begin + total : begin + whole],
                    )
                    del staged
                # Small frames are copied out so the staging buffer can be reused.
                data = self._staging[begin : begin + total]  # a slice is a copy
                self._start = begin + whole
                frames.append(_parse(memoryview(data)))
                continue
            if whole + 8 > len(self._staging):
                have = avail - 8
                if self.handoff_min and whole >= self.handoff_min:
                    # Someone else receives it (off the I/O loop); we wait for them.
                    self.handoff = (whole, bytes(self._staging[self._start + 8 : self._end]))
                    self._start = self._end = 0
                    self._after_big = True
                    break
                # Large frame: receive the rest straight into its own memory.
                try:
                    big = recv_pool.take(whole)
                except (MemoryError, OSError, ValueError, OverflowError) as e:
                    raise FrameError(f"cannot allocate a frame of {total} bytes: {e}") from e
                big[:have] = self._staging[self._start + 8 : self._end]
                self._start = self._end = 0
                self._big, self._big_filled = big, have
                break
            if len(self._staging) - self._start < whole + 8:
                self._compact()
            break
        if self._start == self._end:
            self._start = self._end = 0
        return frames
