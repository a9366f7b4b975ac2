"""Frames round-trip through any chunking, and garbage never gets past the decoder."""

from __future__ import annotations

import pickle
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danaus._errors import PeerBrokenError
from danaus._wire import codec
from danaus._wire.frame import FrameDecoder, FrameError, encode_frame
from danaus._wire.ids import ActorId, PortId, ProcId
from danaus._wire.protocol import Kind, Reply, decode_header, wire


def _wire_bytes(parts: list) -> bytes:
    return b"".join(bytes(memoryview(p).cast("B")) for p in parts)


def _feed_all(dec: FrameDecoder, data: bytes, chunks: list[int]) -> list:
    frames, pos, i = [], 0, 0
    while pos < len(data):
        buf = dec.buffer()
        n = min(len(buf), len(data) - pos, max(1, chunks[i % len(chunks)]))
        i += 1
        buf[:n] = data[pos : pos + n]
        pos += n
        frames.extend(dec.feed(n))
    return frames


headers = st.tuples(
    st.integers(0, 50), st.text(max_size=20), st.integers(-(2**40), 2**40), st.none()
)


@settings(max_examples=150, deadline=None, database=None)
@given(
    msgs=st.lists(
        st.tuples(headers, st.binary(max_size=300), st.lists(st.binary(max_size=200), max_size=3)),
        min_size=1,
        max_size=6,
    ),
    chunks=st.lists(st.integers(1, 5000), min_size=1, max_size=8),
)
def test_frames_round_trip_through_any_chunking(msgs, chunks) -> None:
    data = b"".join(_wire_bytes(encode_frame(h, b, bufs)) for h, b, bufs in msgs)
    frames = _feed_all(FrameDecoder(), data, chunks)
    assert [(f.header, bytes(f.body), [bytes(x) for x in f.buffers]) for f in frames] == [
        (h, b, list(bufs)) for h, b, bufs in msgs
    ]


def test_a_large_frame_is_received_in_place_and_its_buffers_are_writable_views() -> None:
    arr = np.arange(1 << 20, dtype=np.float32)  # 4 MiB, larger than the staging buffer
    body, bufs = codec.dumps(arr)
    data = _wire_bytes(encode_frame((1, "x"), body, bufs))
    frames = _feed_all(FrameDecoder(), data, [65536])
    assert len(frames) == 1
    out = codec.loads(frames[0].body, frames[0].buffers)
    assert out.dtype == np.float32 and np.array_equal(out, arr)
    out[0] = 42.0  # a view of the received frame: writable, no copy was needed


def test_ids_travel_in_headers_as_builtins() -> None:
    proc = ProcId("p1", "unix:/tmp/x.sock")
    header = Reply(7, 3, 0, ActorId(proc, "m", 2))
    (frame,) = _feed_all(FrameDecoder(), _wire_bytes(encode_frame(wire(header))), [10_000])
    assert frame.header == (2, 7, 3, 0, (("p1", "unix:/tmp/x.sock"), "m", 2))
    assert type(frame.header[4]) is tuple  # no class was named on the wire
    kind, typed = decode_header(frame.header)
    assert kind == Kind.REPLY and typed == header
    assert type(typed.sender) is ActorId and type(typed.sender.proc) is ProcId


def test_a_header_naming_a_class_is_refused() -> None:
    # Even danaus's own ids: a header is builtins only.
    header = (2, PortId(ProcId("p1", "unix:/tmp/x.sock"), 7), 3, 0)
    with pytest.raises(FrameError, match=r"may not name danaus\._wire\.ids\.PortId"):
        _feed_all(FrameDecoder(), _wire_bytes(encode_frame(header)), [10_000])


def test_an_absurd_length_is_refused_before_any_allocation() -> None:
    dec = FrameDecoder(max_frame=1 << 20)
    buf = dec.buffer()
    buf[:8] = struct.pack("<Q", 1 << 50)
    with pytest.raises(FrameError, match="refused"):
        dec.feed(8)


def test_lengths_that_do_not_add_up_are_refused() -> None:
    h = pickle.dumps((1,))
    bad = struct.pack("<QIIQ", 16 + len(h) + 5, len(h), 0, 99) + h + b"12345"
    dec = FrameDecoder()
    buf = dec.buffer()
    buf[: len(bad)] = bad
    with pytest.raises(FrameError, match="do not add up"):
        dec.feed(len(bad))


def test_frame_errors_are_peer_broken_transport_errors() -> None:
    assert issubclass(FrameError, PeerBrokenError)


@settings(max_examples=300, deadline=None, database=None)
@given(
    garbage=st.binary(min_size=1, max_size=600), chunks=st.lists(st.integers(1, 700), min_size=1)
)
def test_garbage_either_decodes_or_raises_frame_error_only(garbage: bytes, chunks) -> None:
    """Fuzz: the decoder never raises anything but FrameError, whatever the bytes."""
    dec = FrameDecoder(max_frame=1 << 16)
    try:
        frames = _feed_all(dec, garbage, chunks)
    except FrameError:
        return
    for f in frames:
        assert isinstance(f.header, tuple)


@settings(max_examples=200, deadline=None, database=None)
@given(data=st.data())
def test_corrupting_one_byte_of_a_valid_frame_never_escapes_as_another_error(data) -> None:
    raw = bytearray(_wire_bytes(encode_frame((1, "mesh", 3, "m", None, 0), b"body", [b"buf"])))
    i = data.draw(st.integers(0, len(raw) - 1))
    raw[i] = data.draw(st.integers(0, 255))
    try:
        _feed_all(FrameDecoder(max_frame=1 << 16), bytes(raw), [len(raw)])
    except FrameError:
        pass


# -- warm receive memory ------------------------------------------------------

MiB = 1 << 20


def test_warm_pool_reuses_a_mapping_only_once_nothing_refers_to_it() -> None:
    from danaus._wire.frame import WarmPool

    pool = WarmPool(lambda: 64 * MiB)
    first = pool.take(3 * MiB)
    first[:5] = b"hello"
    arr = np.frombuffer(first, dtype=np.uint8)  # user code builds on the view
    del first
    second = pool.take(3 * MiB)  # the first is still held through `arr`
    assert pool.reused == 0
    second[:5] = b"world"
    assert bytes(arr[:5]) == b"hello"
    del arr
    third = pool.take(3 * MiB)  # now the first mapping is free again: warm, reused
    assert pool.reused == 1
    assert bytes(third[:5]) == b"hello"
    assert len(third) == 3 * MiB
    del second, third
    small = pool.take(1000)  # below the pool's smallest size: a plain fresh mapping
    assert len(small) == 1000 and pool.kept <= 64 * MiB


def test_warm_pool_keeps_at_most_its_limit() -> None:
    from danaus._wire.frame import WarmPool

    pool = WarmPool(lambda: 8 * MiB)
    held = [pool.take(3 * MiB) for _ in range(4)]  # 4 lent, only 2 fit the limit
    assert pool.kept <= 8 * MiB
    del held
    big = pool.take(6 * MiB)  # another size class: free mappings are evicted for it
    assert pool.kept <= 8 * MiB and len(big) == 6 * MiB
    pool.clear()
    assert pool.kept == 0
    off = WarmPool(lambda: 0)
    views = [off.take(2 * MiB) for _ in range(2)]
    assert off.kept == 0 and off.reused == 0 and len(views) == 2


def test_after_a_large_frame_the_next_read_is_short_so_little_is_copied_into_the_next() -> None:
    """A large frame is received straight into its own memory, but what the read that
    found it put in the staging buffer is copied there first. After a large frame the
    decoder asks for at most _PROBE bytes when nothing is pending, so in a stream of
    large frames only that much is copied; after small frames it asks for all again."""
    from danaus._wire.frame import _PROBE, _STAGING

    big = np.arange(1 << 17, dtype=np.float64)  # 1 MiB
    small = [encode_frame((1, "small", i), b"s") for i in range(3)]
    stream = [encode_frame((0, "big", i), b"b", [big]) for i in range(3)] + small
    data = _wire_bytes([p for parts in stream for p in parts])
    dec = FrameDecoder()
    frames, asked, pos = [], [], 0
    while pos < len(data):
        buf = dec.buffer()
        asked.append(len(buf))
        n = min(len(buf), len(data) - pos)  # a socket with everything already in it
        buf[:n] = data[pos : pos + n]
        pos += n
        frames.extend(dec.feed(n))
    assert [f.header for f in frames] == [(0, "big", i) for i in range(3)] + [
        (1, "small", i) for i in range(3)
    ]
    assert all(np.array_equal(np.frombuffer(f.buffers[0], np.float64), big) for f in frames[:3])
    # the first frame's read takes the whole staging buffer, each later one starts short
    assert asked[0] == _STAGING and asked.count(_PROBE) == 3
    assert dec.buffer().nbytes == _STAGING  # small frames since: a full read again


def test_a_frame_from_a_header_pickled_already_is_the_same_frame() -> None:
    """``encode_pickled`` (a cached header pickle) writes byte for byte what
    ``encode_frame`` writes, with and without buffers, small bodies and large."""
    from danaus._wire.frame import encode_pickled

    header = (3, "call", (1, 2))
    h = pickle.dumps(header, protocol=5)
    buf = np.arange(4096, dtype=np.int32)
    for body in (b"", b"small body", bytes(10_000)):
        for bufs in ([], [buf], [buf, b"", bytearray(b"xyz")]):
            want = _wire_bytes(encode_frame(header, body, bufs))
            assert _wire_bytes(encode_pickled(h, body, bufs)) == want
            (frame,) = _feed_all(FrameDecoder(), want, [len(want)])
            assert frame.header == header and bytes(frame.body) == body
            assert [bytes(b) for b in frame.buffers] == [bytes(memoryview(b)) for b in bufs]
