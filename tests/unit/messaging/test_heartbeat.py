"""The heartbeat part alone: pings quiet connections, drops peers judged lost."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest

from danaus._runtime.messaging.liveness import Heartbeat
from danaus._wire.ids import ProcId


class Loop:
    def __init__(self, now: float) -> None:
        self.now = now
        self.later: list[tuple[float, Any]] = []

    def time(self) -> float:
        return self.now

    def call_later(self, delay: float, fn: Any, *args: Any) -> None:
        self.later.append((delay, fn))


class Conn:
    def __init__(self, sock: socket.socket, last_recv: float, last_send: float) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.tcp = True
        self.closed = False
        self.paused = False
        self.authenticated = True
        self.peer: ProcId | None = ProcId("p1", "tcp://10.0.0.2:1")
        self.last_recv = last_recv
        self.last_send = last_send
        self.sent: list[Any] = []
        self.failed: list[str] = []

    def send(self, parts: Any) -> None:
        self.sent.append(parts)

    def fail_now(self, why: str) -> None:
        self.failed.append(why)
        self.closed = True


@pytest.fixture
def sock() -> Iterator[socket.socket]:
    a, b = socket.socketpair()  # nothing written: the peer's socket has nothing unread
    yield a
    a.close()
    b.close()


def beat(loop: Loop, conns: list[Conn], closed: bool = False) -> Heartbeat:
    return Heartbeat(loop, lambda: conns, lambda: "p0", lambda: closed)  # type: ignore[arg-type,return-value]


def test_a_quiet_connection_is_pinged_and_the_next_round_is_scheduled(
    sock: socket.socket, settings: Any
) -> None:
    settings(heartbeat_interval=1.0, heartbeat_timeout=10.0)
    loop = Loop(now=100.0)
    conn = Conn(sock, last_recv=99.5, last_send=98.0)
    hb = beat(loop, [conn])
    hb.tick()
    assert len(conn.sent) == 1 and conn.failed == []
    assert [d for d, _ in loop.later] == [1.0]


def test_a_peer_on_another_host_silent_far_past_the_timeout_is_dropped(
    sock: socket.socket, settings: Any
) -> None:
    settings(heartbeat_interval=1.0, heartbeat_timeout=10.0)
    loop = Loop(now=1000.0)
    conn = Conn(sock, last_recv=0.0, last_send=999.9)
    beat(loop, [conn]).tick()
    assert len(conn.failed) == 1 and "no heartbeat for 1000.0 s" in conn.failed[0]
    assert conn.sent == []  # a dropped connection is not pinged


def test_a_paused_connection_and_our_own_are_not_judged(sock: socket.socket, settings: Any) -> None:
    settings(heartbeat_interval=1.0, heartbeat_timeout=10.0)
    loop = Loop(now=1000.0)
    paused = Conn(sock, last_recv=0.0, last_send=999.9)
    paused.paused = True  # we stopped reading it: its silence is ours
    ours = Conn(sock, last_recv=0.0, last_send=999.9)
    ours.peer = ProcId("p0", "unix:/self")
    hb = beat(loop, [paused, ours])
    hb.tick()
    assert paused.failed == [] and ours.failed == [] and hb.judges == {}


def test_a_closed_runtime_stops_the_heartbeat(sock: socket.socket) -> None:
    loop = Loop(now=1000.0)
    conn = Conn(sock, last_recv=0.0, last_send=0.0)
    beat(loop, [conn], closed=True).tick()
    assert (conn.sent, conn.failed, loop.later) == ([], [], [])
