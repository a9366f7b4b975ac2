"""Direct reads: a thread waiting for a frame reads the connection itself.

A real ``Connection`` on a socket pair, its loop on a thread of its own; the
other end writes frames with ``encode_frame``. ``direct_frame`` takes frames
whose header is ``("mine", n)`` and declines every other one, which the I/O
thread must then deliver, in order, with everything after it. Every wait is
bounded.
"""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from danaus import config
from danaus._errors import PeerBrokenError
from danaus._transport import conn as conn_mod
from danaus._transport.conn import direct as conn_direct
from danaus._wire.frame import Frame, encode_frame
from danaus.testing import wait_until

TIMEOUT = 10.0


class Side:
    """Our end (a Connection) and what happened on it."""

    def __init__(self, conn: conn_mod.Connection, theirs: socket.socket) -> None:
        self.conn = conn
        self.theirs = theirs
        self.direct: list[tuple[Any, int]] = []  # (header, thread id) taken directly
        self.on_loop: list[tuple[Any, int]] = []  # (header, thread id) given to on_frame
        self.closed = threading.Event()
        self.close_exc: BaseException | None = None
        self.readable_calls = 0
        self.loop_thread = 0

    def write(self, *headers: Any) -> None:
        parts: list[Any] = []
        for h in headers:
            parts += [bytes(p) for p in encode_frame(h, b"body")]
        self.theirs.sendall(b"".join(parts))

    def reading(
        self, done: Callable[[], bool], timeout: float = TIMEOUT, bell: int = -1
    ) -> Callable[[], bool | None]:
        """Start ``read_directly`` on a thread and wait until it holds the read role
        (so that what is written next is read there, not by the loop); returns a
        function that joins the thread and gives ``read_directly``'s result (whether
        ``done()`` held when it stopped; None: it could not take the role)."""
        out: list[bool | None] = []
        t = threading.Thread(
            target=lambda: out.append(self.conn.read_directly(done, timeout, bell))
        )
        t.start()
        wait_until(
            lambda: self.conn.direct.active or bool(out), TIMEOUT, "read_directly takes the role"
        )
        assert not out, "read_directly returned before it read"
        with self.conn.direct.mu:  # held while it takes the role: the loop is muted after it
            pass

        def join() -> bool | None:
            t.join(TIMEOUT)
            assert not t.is_alive(), "read_directly did not return"
            return out[0]

        return join


@pytest.fixture
def side() -> Iterator[Side]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    ours, theirs = socket.socketpair()
    theirs.settimeout(TIMEOUT)
    made: list[Side] = []
    ready = threading.Event()

    def build() -> None:
        def on_frame(c: conn_mod.Connection, f: Frame) -> None:
            s.on_loop.append((f.header, threading.get_ident()))

        def on_close(c: conn_mod.Connection, e: BaseException | None) -> None:
            s.close_exc = e
            s.closed.set()

        conn = conn_mod.Connection(ours, loop, on_frame, on_close)
        s = Side(conn, theirs)

        def direct(c: conn_mod.Connection, f: Frame) -> bool:
            if f.header[0] != "mine":
                return False
            s.direct.append((f.header, threading.get_ident()))
            return True

        conn.direct_frame = direct
        counted = conn._on_readable

        def readable() -> None:
            s.readable_calls += 1
            counted()

        # The loop holds the bound method it registered: register the counting one.
        loop.remove_reader(conn.fd)
        conn._on_readable = readable
        loop.add_reader(conn.fd, readable)
        s.loop_thread = threading.get_ident()
        made.append(s)
        ready.set()

    loop.call_soon_threadsafe(build)
    assert ready.wait(TIMEOUT)
    yield made[0]
    if loop.is_closed():  # the test closed it (a runtime's shutdown)
        made[0].conn.sock.close()
        theirs.close()
        return
    if not made[0].conn.closed:
        loop.call_soon_threadsafe(made[0].conn.close)
    made[0].closed.wait(TIMEOUT)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(TIMEOUT)
    loop.close()
    theirs.close()


def test_the_waiting_thread_reads_and_handles_its_frames_the_loop_never_wakes(side: Side) -> None:
    join = side.reading(lambda: len(side.direct) >= 100)  # waits in poll(); the loop too
    for i in range(10):
        side.write(*[("mine", 10 * i + k) for k in range(10)])
    assert join()
    assert [h for h, _ in side.direct] == [("mine", i) for i in range(100)]
    assert len({t for _, t in side.direct}) == 1
    assert side.loop_thread not in {t for _, t in side.direct}
    assert side.on_loop == []
    # While it read, the loop was not told the socket was readable (no spinning on it).
    assert side.readable_calls == 0
    assert side.conn.frames_direct == 100


def test_a_declined_frame_and_all_after_it_go_to_the_io_thread_in_order(side: Side) -> None:
    join = side.reading(lambda: False)
    side.write(("mine", 0), ("other", 1), ("mine", 2), ("other", 3))
    assert join() is False  # it returns after the hand-off
    wait_until(
        lambda: len(side.on_loop), TIMEOUT, "the loop has read 3 frame(s)", until=lambda k: k == 3
    )
    assert [h for h, _ in side.direct] == [("mine", 0)]
    assert [h for h, _ in side.on_loop] == [("other", 1), ("mine", 2), ("other", 3)]
    assert {t for _, t in side.on_loop} == {side.loop_thread}
    # Afterwards the loop reads again by itself.
    side.write(("other", 4))
    wait_until(
        lambda: len(side.on_loop), TIMEOUT, "the loop has read 4 frame(s)", until=lambda k: k == 4
    )


def test_the_wait_ends_at_its_timeout_and_the_loop_then_reads_again(side: Side) -> None:
    assert side.conn.read_directly(lambda: False, 0.05) is False
    side.write(("other", 1))
    wait_until(
        lambda: len(side.on_loop), TIMEOUT, "the loop has read 1 frame(s)", until=lambda k: k == 1
    )


def test_a_bell_ends_the_wait_without_reading(side: Side) -> None:
    bell = os.eventfd(0, os.EFD_NONBLOCK)
    try:
        join = side.reading(lambda: False, TIMEOUT, bell)
        os.eventfd_write(bell, 1)
        assert join() is False
        assert os.eventfd_read(bell) == 1
        assert side.direct == [] and side.on_loop == []
    finally:
        os.close(bell)


def test_garbage_read_directly_closes_the_connection_on_the_io_thread(side: Side) -> None:
    # A header longer than the whole frame: not a frame.
    join = side.reading(lambda: False)
    side.theirs.sendall(struct.pack("<QIIQ", 16, 1 << 30, 0, 0))
    assert join() is False
    assert side.closed.wait(TIMEOUT)
    assert isinstance(side.close_exc, PeerBrokenError)
    # And the role cannot be taken any more.
    assert side.conn.read_directly(lambda: False, 0.01) is None


def test_eof_while_reading_directly_is_reported_by_the_io_thread(side: Side) -> None:
    join = side.reading(lambda: False)
    side.theirs.shutdown(socket.SHUT_RDWR)
    assert join() is False
    assert side.closed.wait(TIMEOUT)
    assert isinstance(side.close_exc, PeerBrokenError)
    assert "EOF" in str(side.close_exc)


def test_closing_from_the_io_thread_wakes_a_direct_reader_which_then_closes_the_socket(
    side: Side,
) -> None:
    join = side.reading(lambda: False)
    side.conn.loop.call_soon_threadsafe(side.conn.close)
    assert join() is False
    assert side.closed.wait(TIMEOUT)
    assert side.conn.sock.fileno() == -1  # released once the reader let go of it
    assert side.conn.read_directly(lambda: False, 0.01) is None


def test_the_role_is_refused_while_the_connection_is_paused(side: Side) -> None:
    done = threading.Event()
    side.conn.loop.call_soon_threadsafe(lambda: (side.conn.pause("test"), done.set()))
    assert done.wait(TIMEOUT)
    assert side.conn.read_directly(lambda: False, 0.01) is None
    side.write(("mine", 0))
    side.conn.loop.call_soon_threadsafe(side.conn.resume, "test")
    wait_until(
        lambda: len(side.on_loop), TIMEOUT, "the loop has read 1 frame(s)", until=lambda k: k == 1
    )  # the loop read it, as usual


def _epoll_mask(conn: conn_mod.Connection) -> int:
    """The kernel's event mask for ``conn``'s socket in its loop's epoll set."""
    epfd = conn.loop._selector._selector.fileno()  # type: ignore[attr-defined]
    with open(f"/proc/self/fdinfo/{epfd}") as f:
        for line in f:
            fields = line.split()
            if fields[:2] == ["tfd:", str(conn.fd)]:
                return int(fields[3], 16)
    raise AssertionError(f"fd {conn.fd} is not in the loop's epoll set")


def test_writes_queued_on_the_loop_during_a_direct_read_keep_the_read_muted(side: Side) -> None:
    """The loop arming its writer re-registers the socket: the direct reader's mute holds,
    and when the read ends the loop watches for reads and writes again."""
    assert _epoll_mask(side.conn) & 0x1  # EPOLLIN: the loop reads
    join = side.reading(lambda: bool(side.direct))
    wait_until(lambda: _epoll_mask(side.conn) & 0x1 == 0, TIMEOUT, "the loop is muted")
    big = b"x" * (1 << 20)
    for _ in range(8):  # more than the socket takes: the loop arms its writer
        side.conn.send([big])
    # Once the loop has armed its writer (EPOLLOUT), reads are still muted: it
    # re-registered the socket and kept the mute in the same step (under the
    # connection's lock). A lost mute shows as 0x5 here, and the wait times out.
    wait_until(
        lambda: _epoll_mask(side.conn) & 0x5 == 0x4,
        TIMEOUT,
        "the writer is armed, reads still muted",
    )
    side.write(("mine", 1))
    assert join()
    assert _epoll_mask(side.conn) & 0x5 == 0x5  # reads and writes watched again
    received = 0
    while received < 8 * len(big):  # and the backlog drains
        received += len(side.theirs.recv(1 << 20))


def test_a_direct_read_outliving_its_loop_ends_quietly(side: Side) -> None:
    """The runtime closed its loop (shutdown) while a thread still read: the read
    ends at its timeout without raising (giving the role back touches the closed
    loop's selector)."""
    join = side.reading(lambda: False, 0.3)
    loop = side.conn.loop
    loop.call_soon_threadsafe(loop.stop)
    wait_until(lambda: not loop.is_running(), TIMEOUT, "the loop stops")
    loop.close()  # closes its selector, as a runtime's close does
    assert join() is False


# -- spinning before blocking (spin_wait) -------------------------------------


@pytest.fixture
def spinning(monkeypatch: pytest.MonkeyPatch) -> None:
    """Spinning allowed whatever this machine's CPU count (one CPU turns it off)."""
    monkeypatch.setattr(conn_direct, "_SPIN_OK", True)


def test_a_frame_that_comes_while_the_reader_spins_is_a_hit(side: Side, spinning: None) -> None:
    # A spin of a minute: the frame can only be read in it (a miss would sleep after).
    with config.configured(spin_wait=60.0):
        join = side.reading(lambda: len(side.direct) >= 1)
        side.write(("mine", 0))
        assert join()
    assert [h for h, _ in side.direct] == [("mine", 0)]
    assert (side.conn.spins_hit, side.conn.spins_missed) == (1, 0)
    assert side.readable_calls == 0  # the loop stayed muted while it spun


def test_a_bell_ends_a_spin(side: Side, spinning: None) -> None:
    bell = os.eventfd(0, os.EFD_NONBLOCK)
    try:
        with config.configured(spin_wait=60.0):
            join = side.reading(lambda: False, 60.0, bell)
            os.eventfd_write(bell, 1)
            assert join() is False  # in well under the minute it would spin for
        assert os.eventfd_read(bell) == 1
        assert side.direct == []
    finally:
        os.close(bell)


def test_after_a_missed_spin_the_next_waits_skip_it_1_2_4_up_to_64(
    side: Side, spinning: None
) -> None:
    spun: list[int] = []
    with config.configured(spin_wait=0.0005):
        for i in range(1, 240):
            before = side.conn.spins_missed
            # Waits of 6 ms: far longer than 3 spins (a slow peer, not a cold one).
            assert side.conn.read_directly(lambda: False, 0.006) is False
            if side.conn.spins_missed > before:
                spun.append(i)
        # Skips of 1, 2, 4, ... 64 between spins, then 64 for good.
        assert spun == [1, 3, 6, 11, 20, 37, 70, 135, 200]
        assert side.conn.spins_hit == 0
        # A hit ends the back-off: after it, the next wait spins again.
        for _ in range(64):
            if not side.conn.direct._spin_skip:
                break
            assert side.conn.read_directly(lambda: False, 0.006) is False
        assert side.conn.direct._spin_skip == 0 and side.conn.spins_missed == len(spun)
        with config.configured(spin_wait=60.0):
            join = side.reading(lambda: len(side.direct) >= 1)
            side.write(("mine", 0))
            assert join()
        assert side.conn.spins_hit == 1
        missed = side.conn.spins_missed
        assert side.conn.read_directly(lambda: False, 0.006) is False
        assert side.conn.spins_missed == missed + 1  # spun at once, no skip left
        assert side.conn.direct._spin_skip == 1  # and the back-off starts again from 1, not 64


def test_a_miss_by_little_does_not_skip_the_next_spin(side: Side) -> None:
    """A wait up to 3 spins long (the peer was slow to wake) keeps spinning: else two
    ends that each wait a little too long would both stop spinning for good. The
    rule itself, with the waits given (a real wait's length is the machine's)."""
    conn, spin = side.conn, 0.0002
    for i in range(1, 6):
        conn.direct._spun_missed(3 * spin, spin)
        assert (conn.spins_missed, conn.direct._spin_skip) == (i, 0)
    conn.direct._spun_missed(3.01 * spin, spin)
    assert conn.direct._spin_skip == 1
    conn.direct._spin_skip = 0
    conn.direct._spun_missed(3.01 * spin, spin)
    assert conn.direct._spin_skip == 2  # repeated slow waits double the skip


def test_spin_wait_0_never_spins(side: Side, spinning: None) -> None:
    with config.configured(spin_wait=0):
        for _ in range(20):
            assert side.conn.read_directly(lambda: False, 0.001) is False
        join = side.reading(lambda: len(side.direct) >= 1)
        side.write(("mine", 0))
        assert join()
    assert (side.conn.spins_hit, side.conn.spins_missed) == (0, 0)


def test_a_spin_as_long_as_the_read_is_no_miss(side: Side, spinning: None) -> None:
    """A waiting future reads in slices of 0.1 s: a spin longer than the slice spins it
    all and never sleeps, so it is no miss (and backs nothing off); the next slice
    spins on. Under load, a reply later than one slice is then still a hit."""
    with config.configured(spin_wait=60.0):
        for _ in range(3):
            assert side.conn.read_directly(lambda: False, 0.01) is False
        assert (side.conn.spins_hit, side.conn.spins_missed) == (0, 0)
        assert side.conn.direct._spin_skip == 0
        join = side.reading(lambda: len(side.direct) >= 1)
        side.write(("mine", 0))
        assert join()
    assert (side.conn.spins_hit, side.conn.spins_missed) == (1, 0)


def test_one_cpu_never_spins(side: Side, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(conn_direct, "_SPIN_OK", False)
    with config.configured(spin_wait=60.0):
        for _ in range(5):
            assert side.conn.read_directly(lambda: False, 0.001) is False
    assert (side.conn.spins_hit, side.conn.spins_missed) == (0, 0)
