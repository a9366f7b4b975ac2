"""The peer table alone: what a lost peer leaves behind (issue 44's soak)."""

from __future__ import annotations

import threading
from typing import Any

from danaus._runtime.messaging.peers import PeerTable, _Peer
from danaus._wire.ids import ProcId
from danaus._wire.protocol import Ping

from .test_sender import World

PEER = ProcId("p1", "unix:/nowhere/p1.sock")


class Conn:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


class Table(PeerTable):
    """A peer table with nothing around it: losses are recorded."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._peers = {}
        self._spares = {}
        self._watchers = {}
        self._exit_waiters = {}
        self._lost_waiters = {}
        self.ports = {}
        self.exited = {}
        self.heard: list[tuple[str, str]] = []
        self.lost_callbacks = [lambda name, why: self.heard.append((name, why))]
        self.notify_room = lambda: None

    def call_soon(self, fn: Any, *args: Any) -> None:
        fn(*args)


def test_a_lost_peer_keeps_why_but_not_its_connections() -> None:
    t = Table()
    peer = t._peers[PEER.name] = _Peer(PEER, pending=False)
    link, dialing, waiting = Conn(), Conn(), Conn()
    peer.conn = peer.link = link  # type: ignore[assignment]
    peer.dialing, peer.waiting = dialing, waiting  # type: ignore[assignment]
    t.peer_lost(PEER.name, "its process exited")
    assert link.closed and dialing.closed and waiting.closed
    # Its connections are let go (a stopped proc's held two 128 KiB buffers, for good);
    # its name stays, lost, so a late frame fails at once with the reason.
    assert (peer.conn, peer.link, peer.dialing, peer.waiting) == (None, None, None, None)
    assert t.is_lost(PEER.name) == "its process exited"
    assert t.heard == [(PEER.name, "its process exited")]


def test_a_frame_to_a_peer_lost_after_it_was_connected_fails_with_the_reason() -> None:
    t = Table()
    w = World()
    t._peers = w.peers
    peer = w.peers[PEER.name] = _Peer(PEER, pending=False)
    peer.conn = peer.link = Conn()  # type: ignore[assignment]
    t.peer_lost(PEER.name, "its process exited")
    reasons: list[str] = []
    w.sender.send(PEER, Ping(), b"", on_fail=reasons.append)
    assert reasons == ["its process exited"]
    assert w.soon == []  # not dialled again
