"""The peer table alone: what a lost peer leaves behind (issue 44's soak)."""

from __future__ import annotations

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


def _table() -> tuple[PeerTable, list[tuple[str, str]]]:
    """A peer table with nothing around it: losses are recorded."""

    def unused(*args: Any) -> Any:
        raise AssertionError("not called by these tests")

    t = PeerTable(
        None,  # type: ignore[arg-type]
        me=lambda: ProcId("me", "unix:/nowhere/me.sock"),
        call_soon=lambda fn, *args: fn(*args),
        connect=unused,
        publish=unused,
        adopt=unused,
        port=lambda no: None,
        open_ports=lambda: [],
        notify_room=lambda: None,
    )
    heard: list[tuple[str, str]] = []
    t.lost_callbacks.append(lambda name, why: heard.append((name, why)))
    return t, heard


def test_a_lost_peer_keeps_why_but_not_its_connections() -> None:
    t, heard = _table()
    peer = t.table[PEER.name] = _Peer(PEER, pending=False)
    link, dialing, waiting = Conn(), Conn(), Conn()
    peer.conn = peer.link = link  # type: ignore[assignment]
    peer.dialing, peer.waiting = dialing, waiting  # type: ignore[assignment]
    t.peer_lost(PEER.name, "its process exited")
    assert link.closed and dialing.closed and waiting.closed
    # Its connections are let go (a stopped proc's held two 128 KiB buffers, for good);
    # its name stays, lost, so a late frame fails at once with the reason.
    assert (peer.conn, peer.link, peer.dialing, peer.waiting) == (None, None, None, None)
    assert t.is_lost(PEER.name) == "its process exited"
    assert heard == [(PEER.name, "its process exited")]


def test_a_frame_to_a_peer_lost_after_it_was_connected_fails_with_the_reason() -> None:
    t, _ = _table()
    w = World()
    t.table = w.peers
    peer = w.peers[PEER.name] = _Peer(PEER, pending=False)
    peer.conn = peer.link = Conn()  # type: ignore[assignment]
    t.peer_lost(PEER.name, "its process exited")
    reasons: list[str] = []
    w.sender.send(PEER, Ping(), b"", on_fail=reasons.append)
    assert reasons == ["its process exited"]
    assert w.soon == []  # not dialled again
