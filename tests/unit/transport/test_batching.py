"""Write batching: small frames one thread sends back to back go out together, in order.

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
from danaus._wire.frame import FrameDecoder, encode_frame

TIMEOUT = 10.0
KIND = 99


@pytest.fixture
def batching() -> conn_mod.Batching:
    """The connections' batching state, as a runtime holds it (its ``flush_held()``
    is what a thread about to wait calls)."""
    return conn_mod.Batching()


@pytest.fixture
def pair(
    batching: conn_mod.Batching,
) -> Iterator[Callable[[], tuple[conn_mod.Connection, Any, list[int]]]]:
    """``make()`` -> (connection, reader, writes): ``reader(n)`` returns the next ``n``
    frames' first header field; ``writes[0]`` counts the connection's socket writes."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    socks: list[socket.socket] = []

    def make() -> tuple[conn_mod.Connection, Any, list[int]]:
        ours, theirs = socket.socketpair()
        socks.extend([ours, theirs])
        theirs.settimeout(TIMEOUT)
        made: list[conn_mod.Connection] = []
        ready = threading.Event()

        def build() -> None:
            made.append(
                conn_mod.Connection(
                    ours, loop, lambda c, f: None, lambda c, e: None, batching=batching
                )
            )
            ready.set()

        loop.call_soon_threadsafe(build)
        assert ready.wait(TIMEOUT)
        conn = made[0]
        writes = [0]
        sock = conn.writer._sock

        class Counted:  # the writer's socket, counting its writes (one sendmsg each)
            def sendmsg(self, parts: list[Any]) -> int:
                writes[0] += 1
                return sock.sendmsg(parts)

        conn.writer._sock = Counted()  # type: ignore[assignment]
        decoder = FrameDecoder()
        got: list[Any] = []

        def read(n: int) -> list[Any]:
            while len(got) < n:
                buf = decoder.buffer()
                k = theirs.recv_into(buf)
                assert k, "the connection closed"
                got.extend(f.header[1] for f in decoder.feed(k))
            out = got[:n]
            del got[:n]
            return out

        return conn, read, writes

    yield make
    for s in socks:
        s.close()
    loop.call_soon_threadsafe(loop.stop)
    thread.join(TIMEOUT)
    loop.close()


def small(i: int) -> list[Any]:
    return [b"".join(bytes(p) for p in encode_frame((KIND, i), b"x" * 20))]


def test_back_to_back_small_frames_go_out_in_batches_in_order(pair, batching, settings) -> None:
    settings(send_batch=16, send_batch_delay=30.0)  # only a full batch or a wait writes
    conn, read, writes = pair()
    for i in range(100):
        conn.send(small(i))
    # The first frame went at once; then full batches of 16: 6 of them; 3 are held.
    assert writes[0] == 7
    assert read(97) == list(range(97))
    batching.flush_held()  # what a thread about to wait does
    assert read(3) == [97, 98, 99]
    assert writes[0] == 8


def test_held_frames_are_written_without_any_wait_after_the_delay(pair, settings) -> None:
    settings(send_batch=64, send_batch_delay=0.05)
    conn, read, writes = pair()
    for i in range(5):
        conn.send(small(i))
    assert read(5) == list(range(5))  # the I/O thread's timer wrote the held four
    assert writes[0] == 2


def test_a_frame_that_cannot_be_held_takes_the_held_ones_with_it_in_order(
    pair, batching, settings
) -> None:
    settings(send_batch=64, send_batch_delay=30.0)
    conn, read, writes = pair()
    for i in range(5):
        conn.send(small(i))
    conn.send(encode_frame((KIND, 5), b"y" * (64 << 10)))  # a large body: two parts
    conn.send(small(6))
    batching.flush_held()
    assert read(7) == list(range(7))
    assert writes[0] == 3  # the first frame, the held four with the large one, the last


def test_a_send_after_a_wait_is_written_at_once(pair, batching, settings) -> None:
    settings(send_batch=64, send_batch_delay=30.0)
    conn, read, writes = pair()
    conn.send(small(0))
    batching.flush_held()  # a thread waited (e.g. for the reply of that call)
    conn.send(small(1))
    assert writes[0] == 2 and not conn.writer._hold
    assert read(2) == [0, 1]


def test_batching_off_writes_every_frame_at_once(pair, settings) -> None:
    settings(send_batch=0, send_batch_delay=30.0)
    conn, read, writes = pair()
    for i in range(10):
        conn.send(small(i))
    assert writes[0] == 10
    assert read(10) == list(range(10))
