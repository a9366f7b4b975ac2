"""The sender part alone: frames to connected, unconnected and lost peers, backpressure."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from danaus._errors import SupervisionError
from danaus._runtime.messaging.peers import _Peer
from danaus._runtime.messaging.sending import Sender
from danaus._wire.frame import encode_frame, encode_pickled
from danaus._wire.ids import ProcId
from danaus._wire.protocol import Ping, Reply, wire

PEER = ProcId("p1", "unix:/nowhere/p1.sock")


class Conn:
    """A connection that records what is written to it."""

    def __init__(self, backlog: int = 0) -> None:
        self.tcp: bool | None = False
        self.closed = False
        self.backlog_bytes = backlog
        self.sent: list[list[Any]] = []

    def send(self, parts: list[Any], on_left: Any = None, *, copy: bool = False) -> None:
        self.sent.append(parts)


class World:
    """A sender and everything it is handed, recorded."""

    def __init__(self, high: int = 1 << 30) -> None:
        self.peers: dict[str, _Peer] = {}
        self.held: dict[str, int] = {}
        self.offloading: set[str] = set()
        self.room_waits: list[_Peer] = []
        self.soon: list[tuple[Any, ...]] = []
        self.sender = Sender(
            self.peers,
            threading.RLock(),
            offloading=self.offloading,
            offloaded=self.held.get,
            wrap=lambda *a, **k: pytest.fail("no large buffers here"),
            high=lambda: high,
            wait_for_room=self.room_waits.append,
            wait_sent=lambda name, ev: None,
            on_io_thread=lambda: False,
            call_soon=lambda fn, *args: self.soon.append((fn, *args)),
            connect=lambda peer: None,
        )

    def connected(self, conn: Conn) -> _Peer:
        peer = self.peers[PEER.name] = _Peer(PEER, pending=False)
        peer.conn = peer.link = conn  # type: ignore[assignment]
        return peer


def _bytes(parts: list[Any]) -> bytes:
    return b"".join(bytes(p) for p in parts)


def test_a_frame_to_a_connected_peer_is_written_on_its_connection() -> None:
    w = World()
    conn = Conn()
    w.connected(conn)
    header = Reply(4, 0, 0)
    w.sender.send(PEER, header, b"body")
    assert [_bytes(p) for p in conn.sent] == [_bytes(encode_frame(wire(header), b"body"))]


def test_cached_header_bytes_are_used_when_there_are_no_buffers() -> None:
    w = World()
    conn = Conn()
    w.connected(conn)
    pickled = b"cached header bytes"
    w.sender.send(PEER, Reply(4, 0, 0), b"body", pickled=pickled)
    assert [_bytes(p) for p in conn.sent] == [_bytes(encode_pickled(pickled, b"body"))]


def test_a_frame_to_an_unknown_peer_waits_in_its_queue_and_the_peer_is_dialled() -> None:
    w = World()
    w.sender.send(PEER, Ping(), b"one")
    w.sender.send(PEER, Ping(), b"two")
    peer = w.peers[PEER.name]
    assert [_bytes(parts) for parts, _, _ in peer.queue] == [
        _bytes(encode_frame(wire(Ping()), b"one")),
        _bytes(encode_frame(wire(Ping()), b"two")),
    ]
    assert peer.queued_bytes == sum(len(_bytes(p)) for p, _, _ in peer.queue)
    assert len(w.soon) == 1  # dialled once, for the first frame


def test_a_frame_to_a_lost_peer_fails_with_the_reason_or_raises() -> None:
    w = World()
    peer = w.peers[PEER.name] = _Peer(PEER, pending=False)
    peer.lost = "its process exited"
    reasons: list[str] = []
    w.sender.send(PEER, Ping(), b"", on_fail=reasons.append)
    assert reasons == ["its process exited"]
    with pytest.raises(SupervisionError, match="proc p1 is unreachable: its process exited"):
        w.sender.send(PEER, Ping(), b"")


def test_a_sender_over_the_high_water_mark_waits_for_room_counting_offloaded_bytes() -> None:
    w = World(high=100)
    conn = Conn(backlog=60)
    peer = w.connected(conn)
    w.sender.send(PEER, Ping(), b"")
    assert w.room_waits == []  # 60 held: under the mark
    w.offloading.add(PEER.name)
    w.held[PEER.name] = 50  # offloaded, not yet released by the peer
    w.sender.send(PEER, Ping(), b"")
    assert w.room_waits == [peer]
    assert len(conn.sent) == 2  # the frame went once there was room


def test_a_large_frame_that_fits_one_write_goes_by_the_socket_a_larger_one_is_offloaded() -> None:
    """Offload agreed with the peer: buffers of offload_min and up are handed to the
    offloader unless the whole frame fits the connection's one write (``one_write``),
    which then carries the caller's buffer itself."""
    wrapped: list[int] = []

    def wrap(name: str, raw: Any, buffers: Any, on_left: Any, *, lend: bool) -> Any:
        wrapped.append(sum(memoryview(b).nbytes for b in buffers))
        return raw, buffers, False

    w = World()
    w.sender._wrap = wrap
    conn = Conn()
    conn.one_write = 2 << 20  # type: ignore[attr-defined]
    w.connected(conn)
    w.offloading.add(PEER.name)
    fits = bytearray(1 << 20)
    w.sender.send(PEER, Reply(4, 0, 0), b"body", [fits])
    assert wrapped == [] and len(conn.sent) == 1
    assert any(memoryview(p).obj is fits for p in conn.sent[0])  # no copy of the buffer
    w.sender.send(PEER, Reply(4, 0, 0), b"body", [bytearray(2 << 20)])
    assert wrapped == [2 << 20]
