"""Frames whose sender hears when they have left (``Connection.send(parts, on_left)``).

A lent frame is not copied: what the socket does not take at once waits in the
backlog as views of the sender's memory, and ``on_left()`` runs once its last
byte went to the kernel (or the connection closed), which is when the runtime
lets a sender of a large message go on (issue 38). With ``copy=True`` the rest
is a snapshot, and ``on_left()`` says when that snapshot is gone.

A real ``Connection`` on a socket pair, its loop on a thread of its own; the
other end is read with a ``FrameDecoder``. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from danaus._transport import conn as conn_mod
from danaus._wire.frame import Frame, FrameDecoder, encode_frame

TIMEOUT = 10.0
N = 8 << 20  # far more than a socket pair's buffer takes at once


@pytest.fixture
def pair() -> Iterator[tuple[conn_mod.Connection, Callable[[], Frame], socket.socket]]:
    """(connection, read one frame from its other end, that end's socket)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    ours, theirs = socket.socketpair()
    theirs.settimeout(TIMEOUT)
    made: list[conn_mod.Connection] = []
    ready = threading.Event()

    def build() -> None:
        made.append(conn_mod.Connection(ours, loop, lambda c, f: None, lambda c, e: None))
        ready.set()

    loop.call_soon_threadsafe(build)
    assert ready.wait(TIMEOUT)
    decoder = FrameDecoder()

    def read() -> Frame:
        while True:
            k = theirs.recv_into(decoder.buffer())
            assert k, "the connection closed"
            frames = decoder.feed(k)
            if frames:
                return frames[0]

    yield made[0], read, theirs
    closed = threading.Event()
    loop.call_soon_threadsafe(lambda: (made[0].close(), closed.set()))
    assert closed.wait(TIMEOUT)
    theirs.close()
    loop.call_soon_threadsafe(loop.stop)
    thread.join(TIMEOUT)
    loop.close()


def _left() -> tuple[threading.Event, Callable[[], None]]:
    calls: list[int] = []
    done = threading.Event()

    def on_left() -> None:
        calls.append(1)
        assert len(calls) == 1, "on_left was called twice"
        done.set()

    return done, on_left


def test_a_lent_frame_waits_uncopied_and_its_sender_hears_once_its_last_byte_left(
    pair: Any,
) -> None:
    conn, read, _ = pair
    data = bytearray(N)
    done, on_left = _left()
    conn.send(encode_frame((1,), b"", [data]), on_left)
    assert not done.is_set()  # the peer has read nothing: most of it waits ...
    assert conn.backlog_bytes > 0
    data[-1] = 7  # ... as the sender's own memory (lent: the sender must wait for on_left)
    frame = read()
    assert done.wait(TIMEOUT)
    assert frame.buffers[0][-1] == 7 and len(frame.buffers[0]) == N


def test_a_copied_frame_is_what_was_passed_and_its_sender_hears_when_the_copy_is_gone(
    pair: Any,
) -> None:
    conn, read, _ = pair
    data = bytearray(N)
    done, on_left = _left()
    conn.send(encode_frame((1,), b"", [data]), on_left, copy=True)
    assert not done.is_set()
    data[-1] = 7  # after the send: not in what was sent
    frame = read()
    assert done.wait(TIMEOUT)
    assert frame.buffers[0][-1] == 0


def test_a_frame_written_at_once_tells_its_sender_at_once(pair: Any) -> None:
    conn, read, _ = pair
    done, on_left = _left()
    conn.send(encode_frame((1,), b"", [bytearray(4096)]), on_left)
    assert done.is_set()
    assert len(read().buffers[0]) == 4096


def test_the_sender_of_a_lent_frame_hears_when_the_connection_closes_before_it_left(
    pair: Any,
) -> None:
    conn, _, _ = pair
    done, on_left = _left()
    conn.send(encode_frame((1,), b"", [bytearray(N)]), on_left)
    assert not done.is_set()
    conn.close_threadsafe()
    assert done.wait(TIMEOUT)  # never left, and never will: the sender goes on


def test_lent_frames_keep_their_order_behind_a_backlog(pair: Any) -> None:
    conn, read, _ = pair
    first, on_first = _left()
    second, on_second = _left()
    conn.send(encode_frame((1,), b"", [bytearray(N)]))  # copied into the backlog
    conn.send(encode_frame((2,), b"", [bytearray(N)]), on_first)
    conn.send(encode_frame((3,), b"x"))
    conn.send(encode_frame((4,), b"", [bytearray(N)]), on_second, copy=True)
    assert [read().header[0] for _ in range(4)] == [1, 2, 3, 4]
    assert first.wait(TIMEOUT) and second.wait(TIMEOUT)
