"""Direct reads between real processes: a caller waiting in ``get()`` reads its reply
itself, an idle actor reads its next call itself, and anything else still reaches
them (``Connection.read_directly``; the transport's own tests are in
``tests/transport/test_direct_read.py``)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from danaus._runtime.node import this_node
from danaus.actor import Actor, ActorMesh, ProcMesh, context, endpoint
from danaus.config import configured

from .conftest import REPLY_TIMEOUT


def _direct_frames(rt: Any) -> int:
    return sum(getattr(c, "frames_direct", 0) for c in rt.links.all_connections())


@contextmanager
def _loop_held(rt: Any) -> Iterator[threading.Event]:
    """Block ``rt``'s I/O thread (in a callback) until the block ends: meanwhile only a
    thread reading directly can read anything."""
    gate, held = threading.Event(), threading.Event()

    def hold() -> None:
        held.set()
        gate.wait(REPLY_TIMEOUT)

    rt.loop.call_soon_threadsafe(hold)
    assert held.wait(REPLY_TIMEOUT), "the I/O thread never ran the holding callback"
    try:
        yield gate
    finally:
        gate.set()


class Echo(Actor):
    @endpoint
    def echo(self, x: Any) -> Any:
        return x

    @endpoint
    def nbytes(self, arr: Any) -> int:
        return int(arr.nbytes)

    @endpoint
    def direct_frames(self) -> int:
        rt = this_node(start=False).runtime
        assert rt is not None
        return _direct_frames(rt)

    @endpoint
    def hold_loop(self) -> None:
        """Block this proc's I/O thread until ``release_loop()``."""
        rt = this_node(start=False).runtime
        self._held = _loop_held(rt)
        self._held.__enter__()

    @endpoint
    def release_loop(self) -> None:
        self._held.__exit__(None, None, None)

    @endpoint
    def relay(self, other: ActorMesh[Echo], x: Any) -> Any:
        """Call ``other`` (an actor of another proc) and return what it answered."""
        return other.echo.call_one(x).get(timeout=REPLY_TIMEOUT)


@pytest.fixture(scope="module")
def whole(procs: ProcMesh) -> Iterator[ActorMesh[Echo]]:
    mesh = procs.spawn("direct_read", Echo)
    mesh.initialized.get(timeout=REPLY_TIMEOUT)
    yield mesh
    mesh.stop().get(timeout=REPLY_TIMEOUT)


@pytest.fixture
def pair(whole: ActorMesh[Echo]) -> tuple[ActorMesh[Echo], ActorMesh[Echo]]:
    return whole.slice(gpus=0), whole.slice(gpus=1)


def test_call_one_round_trips_are_read_by_the_waiting_threads(pair: Any) -> None:
    """With both I/O threads held up, the calls and their replies can only be read by
    the idle actor's thread and the waiting caller: each of them is."""
    a, _ = pair
    rt = this_node().runtime
    client0 = _direct_frames(rt)
    actor0 = a.direct_frames.call_one().get(timeout=REPLY_TIMEOUT)
    a.hold_loop.call_one().get(timeout=REPLY_TIMEOUT)
    try:
        for i in range(50):
            with _loop_held(rt):
                assert a.echo.call_one(i).get(timeout=REPLY_TIMEOUT) == i
    finally:
        a.release_loop.call_one().get(timeout=REPLY_TIMEOUT)
    client = _direct_frames(rt) - client0
    actor = a.direct_frames.call_one().get(timeout=REPLY_TIMEOUT) - actor0
    assert client >= 50, f"only {client} of 50 replies were read by the waiting thread"
    assert actor >= 50, f"only {actor} of 50 calls were read by the idle actor"


def test_a_call_carrying_an_array_and_its_reply_are_read_by_the_waiting_threads(
    pair: Any,
) -> None:
    """A call whose argument is an array (1 MiB, or what one write takes on this
    host's Unix sockets if less) is written whole from the caller's thread, read by the
    idle actor's thread and its reply by the waiting caller: with both I/O threads held
    up, nothing else could move it."""
    import socket

    import numpy as np

    from danaus._transport.conn.buffers import set_unix_sndbuf

    a, _ = pair
    probe, other = socket.socketpair(socket.AF_UNIX)
    with probe, other:
        size = min(1 << 20, set_unix_sndbuf(probe) - (64 << 10))
    arr = np.arange(size // 8, dtype=np.float64)
    rt = this_node().runtime
    a.echo.call_one(0).get(timeout=REPLY_TIMEOUT)  # connected
    client0 = _direct_frames(rt)
    actor0 = a.direct_frames.call_one().get(timeout=REPLY_TIMEOUT)
    a.hold_loop.call_one().get(timeout=REPLY_TIMEOUT)
    try:
        for _ in range(10):
            with _loop_held(rt):
                assert a.nbytes.call_one(arr).get(timeout=REPLY_TIMEOUT) == arr.nbytes
    finally:
        a.release_loop.call_one().get(timeout=REPLY_TIMEOUT)
    client = _direct_frames(rt) - client0
    actor = a.direct_frames.call_one().get(timeout=REPLY_TIMEOUT) - actor0
    assert client >= 10, f"only {client} of 10 replies were read by the waiting thread"
    assert actor >= 10, f"only {actor} of 10 calls were read by the idle actor"


def test_a_caller_spinning_for_its_reply_reads_it_without_sleeping(pair: Any) -> None:
    """With a spin longer than any reply takes, every direct read of a reply is a hit
    (read while spinning), and none falls asleep first. The client's I/O thread is
    held up for each call, so that the caller is the one reading its reply."""
    a, _ = pair
    rt = this_node().runtime
    a.echo.call_one(0).get(timeout=REPLY_TIMEOUT)  # connected, the role free

    def spins() -> tuple[int, int]:
        conns = rt.links.all_connections()
        return sum(c.spins_hit for c in conns), sum(c.spins_missed for c in conns)

    with configured(spin_wait=REPLY_TIMEOUT):
        # Waits of earlier tests may have left spinning skipped for the next few (up
        # to 64) waits; the first hit ends that.
        for _ in range(70):
            before = spins()[0]
            with _loop_held(rt):
                assert a.echo.call_one(0).get(timeout=REPLY_TIMEOUT) == 0
            if spins()[0] > before:
                break
        hit0, missed0 = spins()
        for i in range(50):
            with _loop_held(rt):
                assert a.echo.call_one(i).get(timeout=REPLY_TIMEOUT) == i
    hit, missed = spins()
    assert missed == missed0
    assert hit - hit0 == 50, f"{hit - hit0} of 50 replies were read while spinning"


def test_a_call_on_another_connection_wakes_an_actor_reading_its_last_callers(
    pair: Any,
) -> None:
    """``a`` idles reading the client's connection; ``b``'s calls come on another one,
    through ``a``'s I/O thread, which must end ``a``'s read (its bell). Without
    the bell each relay would wait for the read to time out (1 s): 100 of them
    outlast the test's timeout."""
    a, b = pair
    for i in range(100):
        assert a.echo.call_one(i).get(timeout=REPLY_TIMEOUT) == i  # home: the client
        assert b.relay.call_one(a, -i).get(timeout=REPLY_TIMEOUT) == -i


def test_gathers_and_call_one_interleave_on_the_same_connections(
    pair: Any, procs: ProcMesh
) -> None:
    """Replies to a gather (read by the I/O thread) and to call_one (read by the caller)
    on the same connections, back to back: every one arrives, none twice."""
    a, b = pair
    both = procs.spawn("direct_read_both", Echo)
    try:
        for i in range(30):
            assert sorted(both.echo.call(i).get(timeout=REPLY_TIMEOUT).values()) == [i, i]
            assert a.echo.call_one(i).get(timeout=REPLY_TIMEOUT) == i
            assert b.echo.call_one(i).get(timeout=REPLY_TIMEOUT) == i
    finally:
        both.stop().get(timeout=REPLY_TIMEOUT)


class Home(Actor):
    @endpoint
    def home(self) -> str | None:
        """The proc whose connection this actor reads when idle (None: none)."""
        cell = context().actor_instance._cell
        home = cell.inbox.home
        return None if home is None else home.name


def test_only_an_actor_called_alone_and_directly_reads_that_connection(
    procs: ProcMesh,
) -> None:
    """Casts are routed by the I/O thread: an actor reading the connection they come
    on would only hand each one back (three wake-ups instead of two). A call to
    several actors sent directly (a gather) does not make them read it either:
    they wait long between calls, and waking them there cost the caller more."""
    tree = procs.spawn("direct_read_tree", Home)
    plain = procs.spawn("direct_read_plain", Home)
    try:
        with configured(tree_min_ranks=2):  # decided at the mesh's first message
            homes = tree.home.call().get(timeout=REPLY_TIMEOUT)  # through the tree
        assert list(homes.values()) == [None, None]
        # Sent directly to one actor: it then reads the client's connection.
        me = this_node().runtime.proc_id.name
        alone = [plain.slice(gpus=i).home.call_one().get(timeout=REPLY_TIMEOUT) for i in (0, 1)]
        assert alone == [me, me]
        # Sent directly to both at once: neither does (any more).
        assert list(plain.home.call().get(timeout=REPLY_TIMEOUT).values()) == [None, None]
    finally:
        tree.stop().get(timeout=REPLY_TIMEOUT)
        plain.stop().get(timeout=REPLY_TIMEOUT)


def test_many_threads_calling_share_the_connection_and_each_gets_its_own_answers(
    pair: Any, whole: ActorMesh[Echo]
) -> None:
    """Eight threads call the same actor at once: one of them reads the connection
    at a time and completes the others' futures too; a ninth calls the other actor
    and a tenth gathers from both meanwhile."""
    a, b = pair
    errors: list[BaseException] = []

    def caller(k: int) -> None:
        try:
            for i in range(150):
                x = k * 1000 + i
                assert a.echo.call_one(x).get(timeout=REPLY_TIMEOUT) == x
        except BaseException as e:
            errors.append(e)

    def other() -> None:
        try:
            for i in range(50):
                assert b.echo.call_one(-i).get(timeout=REPLY_TIMEOUT) == -i
        except BaseException as e:
            errors.append(e)

    def gatherer(both: ActorMesh[Echo]) -> None:
        try:
            for i in range(50):
                assert list(both.echo.call(i).get(timeout=REPLY_TIMEOUT).values()) == [i, i]
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=caller, args=(k,)) for k in range(8)]
    threads.append(threading.Thread(target=other))
    threads.append(threading.Thread(target=gatherer, args=(whole,)))
    for t in threads:
        t.start()
    for t in threads:
        t.join(4 * REPLY_TIMEOUT)
    assert not any(t.is_alive() for t in threads), "a caller hung"
    assert errors == []
