"""One connection per pair of procs, carrying both directions.

Runtimes in this process (each on its own I/O thread) talk over Unix
sockets, TCP with the job secret, or in-process connections; real procs are
checked through the kernel's own table of Unix sockets.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import shutil
import subprocess
import threading
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from danaus._runtime.messaging.runtime import Runtime
from danaus._transport.address import make_job_dir
from danaus._transport.state import Transport
from danaus._wire.ids import ProcId
from danaus._wire.protocol import Bounce, Kind
from danaus.actor import Actor, ProcMesh, endpoint, this_host
from danaus.testing import wait_until

SECRET = b"0123456789abcdef" * 4
TIMEOUT = 20.0


class _Node:
    """A runtime recording the BOUNCE frames it receives (a kind a bare runtime leaves free)."""

    def __init__(self, name: str, how: str, shared: Transport) -> None:
        self.how = how
        if how == "inproc":
            import asyncio

            self.rt = Runtime(
                name,
                make_job_dir(),
                loop=asyncio.new_event_loop(),
                inproc=True,
                transport=shared,  # one in-process network for both
            )
        else:
            self.rt = Runtime(name, make_job_dir(), secret=SECRET)
        self.got: queue.Queue[Any] = queue.Queue()
        self.events: list[Any] = []  # notes and losses, in the order the I/O thread saw them
        self.rt.register(Kind.BOUNCE, self._on_note)
        self.rt.peers.lost_callbacks.append(self._on_lost)
        self.rt.start(in_thread=True)
        if how == "tcp":
            self.rt.listen_tcp("127.0.0.1", "127.0.0.1")

    def _on_note(self, conn: Any, msg: Any) -> None:
        self.events.append(("note", msg.header.dest))
        self.got.put(msg.header.dest)

    def _on_lost(self, name: str, reason: str) -> None:
        stack = [f.name for f in traceback.extract_stack()]
        self.events.append(("lost", name, reason, stack))
        self.got.put(("lost", name))

    @property
    def addr(self) -> ProcId:
        """How the other runtimes reach this one (TCP only, for the tcp case)."""
        pid = self.rt.proc_id
        if self.how == "tcp":
            entry = next(e for e in pid.addr.split(";") if e.startswith("tcp://"))
            return ProcId(pid.name, entry)
        return pid

    def on_io(self, fn: Callable[[], Any]) -> Any:
        done: queue.Queue[Any] = queue.Queue()

        def run() -> None:
            try:
                done.put((True, fn()))
            except BaseException as e:
                done.put((False, e))

        self.rt.call_soon(run)
        ok, value = done.get(timeout=TIMEOUT)
        if not ok:
            raise value
        return value

    def note(self, other: _Node, text: str) -> None:
        self.rt.send(other.addr, Bounce(None, text, ""))  # type: ignore[arg-type]

    def expect(self, *texts: str) -> None:
        got = [self.got.get(timeout=TIMEOUT) for _ in texts]
        assert got == list(texts)

    def links(self, other: _Node) -> list[tuple[str, Any]]:
        """Our open connections with ``other``: ``(direction, connection)``."""
        return self.on_io(
            lambda: [
                (d, c)
                for name, d, c in self.rt.links.connections()
                if name == other.rt.proc_id.name
            ]
        )

    def stop(self) -> None:
        rt = self.rt

        def close_all() -> None:
            rt.close()
            for conn in rt.links.all_connections():
                conn.close()
            rt.loop.stop()

        rt.call_soon(close_all)
        assert rt.thread is not None
        rt.thread.join(TIMEOUT)
        rt.loop.close()
        rt.transport.inproc.unlisten(rt.proc_id.name)
        with contextlib.suppress(OSError):
            os.rmdir(rt.job_dir)


@pytest.fixture(params=["unix", "tcp", "inproc"])
def pair(request: pytest.FixtureRequest) -> Iterator[Callable[[], tuple[_Node, _Node]]]:
    made: list[_Node] = []
    tag = os.urandom(3).hex()
    shared = Transport()

    def make() -> tuple[_Node, _Node]:
        # "a..." < "b...": when both dial at once, a's dial wins.
        a = _Node(f"a{tag}", request.param, shared)
        b = _Node(f"b{tag}", request.param, shared)
        made.extend([a, b])
        return a, b

    yield make
    for node in made:
        node.stop()
    shared.close()


def test_a_pair_messaging_both_ways_shares_one_connection(pair) -> None:
    a, b = pair()
    a.note(b, "a1")
    b.expect("a1")
    for i in range(20):
        b.note(a, f"b{i}")
        a.note(b, f"a{i + 2}")
    a.expect(*[f"b{i}" for i in range(20)])
    b.expect(*[f"a{i + 2}" for i in range(20)])
    # a dialled, b answered on a's connection and never dialled back.
    assert [d for d, _ in a.links(b)] == ["out"]
    assert [d for d, _ in b.links(a)] == ["in"]


@pytest.mark.parametrize("first", ["a", "b"])
def test_when_both_dial_at_once_one_connection_wins_and_nothing_is_lost_or_reordered(
    pair, first
) -> None:
    a, b = pair()
    barrier = threading.Barrier(2, timeout=TIMEOUT)

    def dial(me: _Node, other: _Node) -> Callable[[], None]:
        def go() -> None:
            barrier.wait()  # both I/O threads dial before either reads anything
            for i in range(5):
                me.note(other, f"{me.rt.proc_id.name[0]}{i}")
            me.rt.links.connect(me.rt.peers.table[other.rt.proc_id.name])

        return go

    order = [(a, b), (b, a)] if first == "a" else [(b, a), (a, b)]
    for me, other in order:
        me.rt.call_soon(dial(me, other))
    b.expect(*[f"a{i}" for i in range(5)])
    a.expect(*[f"b{i}" for i in range(5)])
    # Then more, both ways, on whatever connection won.
    for i in range(5, 30):
        a.note(b, f"a{i}")
        b.note(a, f"b{i}")
    b.expect(*[f"a{i}" for i in range(5, 30)])
    a.expect(*[f"b{i}" for i in range(5, 30)])
    # The smaller name's dial won; the other one is closed on both sides.
    wait_until(
        lambda: len(a.links(b)) == 1 and len(b.links(a)) == 1,
        TIMEOUT,
        "the losing dial is closed",
        interval=0.005,
    )
    ((da, ca),) = a.links(b)
    ((db, cb),) = b.links(a)
    assert (da, db) == ("out", "in")
    assert a.on_io(lambda: a.rt.peers.table[b.rt.proc_id.name].conn) is ca
    assert b.on_io(lambda: b.rt.peers.table[a.rt.proc_id.name].conn) is cb
    assert not [e for e in a.events + b.events if e[0] == "lost"]


def test_a_peer_that_closes_is_lost_at_once_after_everything_it_sent(pair) -> None:
    a, b = pair()
    a.note(b, "hello")
    b.expect("hello")

    def say_and_close() -> None:
        for i in range(100):
            b.note(a, f"b{i}")
        b.rt.close()  # flushes what it queued, then closes: a reads it all, then EOF

    b.rt.call_soon(say_and_close)
    wait_until(lambda: any(e[0] == "lost" for e in a.events), TIMEOUT, "a loses b", interval=0.005)
    notes = [e[1] for e in a.events if e[0] == "note"]
    assert notes == [f"b{i}" for i in range(100)]
    (lost,) = [e for e in a.events if e[0] == "lost"]
    assert a.events[-1] is lost  # after every frame b sent, on the same connection
    assert lost[1] == b.rt.proc_id.name
    # Declared by the close itself, not by a timer that let another connection drain.
    assert "on_closed" in lost[3]  # Links.on_closed, the connection's close handler


def test_the_inbound_drain_wait_is_gone() -> None:
    import danaus.config

    with pytest.raises(ValueError, match="inbound_drain_timeout"):
        danaus.config.configure(inbound_drain_timeout=1.0)
    assert not hasattr(Runtime, "_on_outbound_closed")


# -- real procs: the kernel's view -----------------------------------------------------


class Pinger(Actor):
    def __init__(self) -> None:
        self.peer: Any = None

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def meet(self, peer: Any) -> None:
        self.peer = peer

    @endpoint
    def ping(self, n: int) -> int:
        return n

    @endpoint
    def ping_peer(self, n: int) -> list[int]:
        return [self.peer.ping.call_one(i).get(timeout=TIMEOUT) for i in range(n)]


def _socket_inodes(pid: int) -> set[int]:
    out = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            m = re.fullmatch(r"socket:\[(\d+)\]", os.readlink(f"/proc/{pid}/fd/{fd}"))
            if m:
                out.add(int(m.group(1)))
    return out


def _unix_pairs() -> list[tuple[int, int]]:
    """``(inode, peer inode)`` of every connected Unix stream socket (``ss -x``)."""
    text = subprocess.run(
        ["ss", "-xnH", "state", "connected"], capture_output=True, text=True, check=True
    ).stdout
    pairs = []
    for line in text.splitlines():
        fields = line.split()
        # Netid State Recv-Q Send-Q Local-Address Port Peer-Address Port
        if fields and fields[0] == "u_str":
            pairs.append((int(fields[-3]), int(fields[-1])))
    return pairs


@pytest.fixture(scope="module")
def two_procs() -> Iterator[ProcMesh]:
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    yield pm
    pm.stop().get(timeout=TIMEOUT)


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs the ss tool")
def test_two_procs_calling_each_other_share_exactly_one_socket(two_procs) -> None:
    callers = two_procs.spawn("callers", Pinger)
    servers = two_procs.spawn("servers", Pinger)
    one, two = callers.slice(gpus=0), callers.slice(gpus=1)
    p1, p2 = one.pid.call_one().get(timeout=TIMEOUT), two.pid.call_one().get(timeout=TIMEOUT)
    one.meet.call_one(servers.slice(gpus=1)).get(timeout=TIMEOUT)
    two.meet.call_one(servers.slice(gpus=0)).get(timeout=TIMEOUT)
    # Both ways, in turn and at once.
    assert one.ping_peer.call_one(3).get(timeout=TIMEOUT) == [0, 1, 2]
    assert two.ping_peer.call_one(3).get(timeout=TIMEOUT) == [0, 1, 2]
    both = [one.ping_peer.call_one(20), two.ping_peer.call_one(20)]
    assert [f.get(timeout=TIMEOUT) for f in both] == [list(range(20))] * 2
    mine, theirs = _socket_inodes(p1), _socket_inodes(p2)
    between = [(x, y) for x, y in _unix_pairs() if x in mine and y in theirs]
    assert len(between) == 1, between
