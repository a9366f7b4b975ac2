"""The actor's inbox on its own: order, backpressure, deadlock refusals, draining."""

from __future__ import annotations

import asyncio
import queue
from collections.abc import Callable
from typing import Any

import pytest

from danaus._actor.core.inbox import ANSWERED, Bounced, Inbox, Item, Stop, Supervise
from danaus._runtime.messaging.flow import frame_bytes
from danaus._runtime.messaging.metrics import MessageRow, Recent
from danaus._wire.protocol import Message

from .conftest import CALLER, ME, FakeHost, call_frame


class Recorder:
    """The cell's side of the inbox's callbacks."""

    def __init__(self) -> None:
        self.refused: list[Item] = []
        self.deadlocked: list[Message] = []
        self.cycles = False  # whether every call closes a cycle (the actor is in its chain)

    def inbox(self, host: FakeHost, loop: asyncio.AbstractEventLoop | None = None) -> Inbox:
        return Inbox(
            host,
            recent=host.observing.recent,
            reader_for=host.reader_for,
            flush_held=host.flush_held,
            loop=loop,
            closes_cycle=lambda frame: self.cycles and ME in frame.header.chain,
            refuse_deadlock=self.deadlocked.append,
            refuse=self.refused.append,
        )


def next_item(inbox: Inbox) -> Item:
    """A sync actor's next item, as its loop takes it."""
    try:
        return inbox.poll()
    except queue.Empty:
        return inbox.wait_next()


@pytest.fixture
def cell() -> Recorder:
    return Recorder()


def test_items_come_out_in_the_order_they_went_in(host: FakeHost, cell: Recorder) -> None:
    inbox = cell.inbox(host)
    first, second = call_frame(slot=1), call_frame(slot=2)
    inbox.deliver(first, CALLER)
    inbox.put(Supervise("a failure"))
    inbox.deliver(second, CALLER)
    inbox.put(Stop(None, 0, "done"))
    got = [next_item(inbox) for _ in range(4)]
    assert got[0] is first and got[2] is second
    assert isinstance(got[1], Supervise) and got[1].failure == "a failure"
    assert got[1].hook == "__supervise__"
    assert got[3] == Stop(None, 0, "done")
    assert inbox.received == 2 and inbox.queued == 2  # queued until the actor takes them
    assert inbox.take(first) is None and inbox.take(second) is None
    assert inbox.queued == 0


def test_an_idle_actor_lets_go_of_its_batched_writes_before_it_waits(
    host: FakeHost, cell: Recorder
) -> None:
    inbox = cell.inbox(host)
    frame = call_frame()
    host.on_flush = lambda: inbox.deliver(frame, None)  # the call the flush brings back
    assert next_item(inbox) is frame
    assert host.events == [("flush_held",)]
    inbox.put(Stop(None, 0, "x"))
    assert type(next_item(inbox)) is Stop
    assert host.events == [("flush_held",)]  # not idle: no flush


def test_calls_above_high_water_pause_their_connection_until_taken_below_low_water(
    host: FakeHost, cell: Recorder, settings: Callable[..., None]
) -> None:
    settings(inbox_high_water=25, inbox_low_water=10)
    inbox = cell.inbox(host)
    frames = [call_frame(slot=i, body=b"x" * 10) for i in range(3)]
    inbox.deliver(frames[0], CALLER)
    inbox.deliver(frames[1], CALLER)
    assert host.paused == [] and inbox.gate.bytes == 20
    inbox.deliver(frames[2], CALLER)  # 30 > 25: the connection it came on pauses
    assert host.paused == [inbox.gate]
    assert inbox.gate.holding
    # A call read off the I/O thread that would cross the mark is left to the I/O thread.
    assert not inbox.direct_call(call_frame(body=b"y"), CALLER)
    for _f in frames:
        next_item(inbox)
    inbox.take(frames[0])  # 20 left: above low water
    assert host.resumed == []
    inbox.take(frames[1])  # 10: read again
    assert host.resumed == [["conn0"]]
    assert inbox.direct_call(call_frame(body=b"y"), CALLER)


@pytest.mark.parametrize("why", ["waiting", "held back", "stopped"])
def test_an_actor_that_cannot_consume_pauses_nothing(
    host: FakeHost, cell: Recorder, settings: Callable[..., None], why: str
) -> None:
    settings(inbox_high_water=15, inbox_low_water=5)
    inbox = cell.inbox(host)
    if why == "waiting":
        inbox.begin_wait()
    elif why == "held back":
        inbox.held_back(True)
    else:
        inbox.close()
    inbox.deliver(call_frame(slot=0), CALLER)
    inbox.deliver(call_frame(slot=1), CALLER)
    assert host.paused == []  # what would unblock it may be behind those bytes
    if why == "held back":
        inbox.held_back(False)
        inbox.deliver(call_frame(slot=2), CALLER)
        assert host.paused == [inbox.gate]


def test_a_wait_tells_the_inbox_first_and_the_runtime_after(host: FakeHost, cell: Recorder) -> None:
    inbox = cell.inbox(host)
    inbox.begin_wait()
    assert inbox.waiting == 1 and host.events == [("begin_wait",)]
    inbox.end_wait()
    assert inbox.waiting == 0 and host.events == [("begin_wait",), ("end_wait",)]


def test_a_call_that_cycles_back_while_the_actor_waits_is_refused_on_arrival(
    host: FakeHost, cell: Recorder
) -> None:
    cell.cycles = True
    inbox = cell.inbox(host)
    cycling = call_frame(chain=(ME,))
    inbox.deliver(cycling, CALLER)  # not waiting: it queues
    inbox.begin_wait()  # the queued one is refused now, and skipped when taken
    late = call_frame(slot=1, chain=(ME,))
    inbox.deliver(late, CALLER)  # waiting: refused at once, never queued
    plain = call_frame(slot=2)
    inbox.deliver(plain, CALLER)
    assert cell.deadlocked == [cycling, late]
    assert next_item(inbox) is cycling
    assert inbox.take(cycling) is ANSWERED
    assert next_item(inbox) is plain
    assert inbox.take(plain) is None
    assert inbox.received == 3


def test_closing_refuses_what_is_left_and_what_comes_after(host: FakeHost, cell: Recorder) -> None:
    inbox = cell.inbox(host)
    left = call_frame(slot=1)
    inbox.deliver(left, CALLER)
    inbox.put(Bounced("an envelope"))
    inbox.close()
    later = call_frame(slot=2)
    inbox.deliver(later, CALLER)
    inbox.put(Stop(None, 0, "again"))
    assert cell.refused[0] is left
    assert isinstance(cell.refused[1], Bounced) and cell.refused[1].envelope == "an envelope"
    assert cell.refused[2] is later and type(cell.refused[3]) is Stop
    assert inbox.gate.bytes == 0  # a refused call's bytes leave the count
    inbox.release()
    assert inbox.queued == 0


def test_a_sampled_call_has_a_row_from_its_arrival(host: FakeHost, cell: Recorder) -> None:
    host.observing.recent = Recent(size=10, per_s=1_000_000)
    inbox = cell.inbox(host)
    frame = call_frame()
    inbox.deliver(frame, CALLER)
    row = inbox.take(frame)
    assert isinstance(row, MessageRow) and row is not ANSWERED
    assert row.arrived_ns > 0 and row.stride == 1
    assert inbox.take(frame) is None  # taken once


def test_only_a_call_to_one_actor_makes_the_inbox_read_its_connection(
    host: FakeHost, cell: Recorder
) -> None:
    inbox = cell.inbox(host)
    inbox.deliver(call_frame(sizes=(1, 1)), CALLER)
    assert inbox.home == CALLER
    inbox.deliver(call_frame(sizes=(4,)), CALLER)  # a call to several (a gather)
    assert inbox.home is None
    inbox.deliver(call_frame(), CALLER)
    inbox.deliver(call_frame(), None)  # a cast's copy: the connection stays
    assert inbox.home == CALLER


def test_an_idle_actor_reads_its_home_connection_until_an_item_comes(
    host: FakeHost, cell: Recorder
) -> None:
    inbox = cell.inbox(host)
    inbox.open_bell(direct=True)
    first = call_frame()
    inbox.deliver(first, CALLER)
    assert next_item(inbox) is first
    reads: list[float] = []
    second = call_frame(slot=1)

    class Conn:
        def read_directly(
            self, done: Callable[[], bool], timeout: float, bell: int = -1
        ) -> bool | None:
            reads.append(timeout)
            assert bell >= 0 and not done()
            inbox.deliver(second, CALLER)  # the call it reads is delivered on its thread
            assert done()
            return True

    host.reader = Conn()
    try:
        assert next_item(inbox) is second
    finally:
        inbox.close_bell()
    assert len(reads) == 1


def test_an_async_inbox_hands_items_to_its_loop(host: FakeHost, cell: Recorder) -> None:
    loop = asyncio.new_event_loop()
    inbox = cell.inbox(host, loop)
    frame = call_frame()
    inbox.deliver(frame, CALLER)
    inbox.put(Stop(None, 0, "x"))

    async def two() -> list[Any]:
        return [await inbox.next_async(), await inbox.next_async()]

    got = loop.run_until_complete(two())
    assert got[0] is frame and type(got[1]) is Stop
    inbox.close()
    inbox.put(Supervise("late"))
    inbox.close_loop()
    assert loop.is_closed() and isinstance(cell.refused[0], Supervise)
    assert frame_bytes(frame) == 10
