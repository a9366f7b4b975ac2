"""The peer table alone: what a lost peer leaves behind (issue 44's soak)."""

from __future__ import annotations

from typing import Any

from danaus._runtime.messaging.peers import PeerTable, _Peer
from danaus._wire.ids import ProcId
from danaus._wire.protocol import Message, Ping

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


class Loop:
    """Timers recorded, run by the test."""

    def __init__(self) -> None:
        self.timers: list[tuple[float, Any, tuple[Any, ...]]] = []

    def call_later(self, delay: float, fn: Any, *args: Any) -> None:
        self.timers.append((delay, fn, args))

    def run(self, delay: float) -> None:
        for d, fn, args in list(self.timers):
            if d == delay:
                fn(*args)


AGENT = ProcId("a1", "unix:/nowhere/a1.sock")


def _stopping(agent: str | None) -> tuple[PeerTable, Loop, list[str]]:
    """A table that spawned PEER (on AGENT, connected) and waits for its exit."""
    t, _ = _table()
    loop = t.loop = Loop()  # type: ignore[assignment]
    t.table[PEER.name] = _Peer(PEER, pending=False)
    t.table[AGENT.name] = _Peer(AGENT, pending=False)
    exited: list[str] = []
    t.when_exited(PEER.name, exited.append, grace=1.0, agent=agent, bound=30.0)
    return t, loop, exited


def test_a_stopped_proc_whose_agent_lives_is_exited_only_when_the_agent_says_so() -> None:
    t, loop, exited = _stopping(AGENT.name)
    t.peer_lost(PEER.name, "connection closed: it stopped")
    loop.run(1.0)  # its exit handlers may still run: the connection's close is not its end
    assert exited == []
    report = Message(None, (PEER.name, "exited with code 0"), memoryview(b""), [])  # type: ignore[arg-type]
    t.on_lost_report(None, report)  # type: ignore[arg-type]
    assert exited == ["exited with code 0"]
    loop.run(30.0)
    assert exited == ["exited with code 0"]  # once
    # The agent keeps no closure per stopped proc (a long run stops thousands).
    assert AGENT.name not in t._lost_waiters and PEER.name not in t._exit_waiters


def test_a_stopped_proc_whose_agent_is_lost_too_is_exited_after_the_grace() -> None:
    t, loop, exited = _stopping(AGENT.name)
    t.peer_lost(PEER.name, "connection closed")
    t.peer_lost(AGENT.name, "its host vanished")
    assert [d for d, _, _ in loop.timers] == [30.0, 1.0]
    loop.run(1.0)
    assert exited == ["connection closed"]


def test_a_stopped_proc_is_exited_at_the_bound_if_its_living_agent_never_reports() -> None:
    t, loop, exited = _stopping(AGENT.name)
    t.peer_lost(PEER.name, "connection closed")
    loop.run(30.0)
    assert exited == ["connection closed"]


def test_without_its_agent_a_lost_proc_is_exited_after_the_grace() -> None:
    t, loop, exited = _stopping(None)
    t.peer_lost(PEER.name, "connection closed")
    assert [d for d, _, _ in loop.timers] == [1.0]
    loop.run(1.0)
    assert exited == ["connection closed"]


def test_a_stopped_proc_whose_agent_was_never_heard_from_is_exited_after_the_grace() -> None:
    t, loop, exited = _stopping("a-stranger")  # no entry: it cannot be heard of again
    t.peer_lost(PEER.name, "connection closed")
    assert sorted(d for d, _, _ in loop.timers) == [1.0, 30.0]
    loop.run(1.0)
    assert exited == ["connection closed"]
