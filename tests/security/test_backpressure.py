"""Backpressure: every queue that holds bytes is bounded and pushes back on its sender.

A thread that sends to a peer for which its process already holds more than
``send_high_water`` bytes blocks until they drain to ``send_low_water`` (the
I/O thread never blocks); a consumer whose inbox is over ``inbox_high_water``
pauses the connections that feed it. Blocking gives up when the peer is
lost, and waits never cycle through a paused connection.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import numpy as np
import pytest

import danaus.config
from danaus._errors import SupervisionError
from danaus._runtime.messaging.flow import Gate
from danaus.actor import Actor, Channel, endpoint, this_host
from danaus.testing import wait_until

from .conftest import KIND, TIMEOUT, Node, note

pytestmark = pytest.mark.timeout(120)

MiB = 1 << 20
FRAME = 256 << 10
HIGH, LOW = 1 * MiB, 256 << 10


# -- the runtime: a sender blocks, the I/O thread does not, a loss unblocks ---------


def _pause_inbound(node: Node) -> None:
    node.on_io(lambda: [c.pause("test") for c in node.rt.links.incoming])


def _resume_inbound(node: Node) -> None:
    node.on_io(lambda: [c.resume("test") for c in node.rt.links.incoming])


def _outbound(node: Node, name: str) -> int:
    return node.rt.backpressure.outbound(node.rt.peers.table[name])


def test_a_sender_blocks_above_the_high_water_mark_and_the_io_thread_does_not(nodes) -> None:
    with danaus.config.configured(send_high_water=HIGH, send_low_water=LOW):
        a, b = nodes("a"), nodes("b")
        a.rt.send(b.tcp, note("hello"))
        assert b.got.get(timeout=TIMEOUT) == (KIND, "hello")
        _pause_inbound(b)  # b stops reading: a's bytes back up
        n = 256  # 64 MiB: far more than the kernel's buffers and the mark
        payload = bytes(FRAME)
        done = threading.Event()

        def flood() -> None:
            for i in range(n):
                a.rt.send(b.tcp, note(str(i)), payload)
            done.set()

        t = threading.Thread(target=flood)
        t.start()
        wait_until(lambda: a.rt.backpressure.room_waiters == 1, TIMEOUT, "the sender blocks")
        held = _outbound(a, "b")
        assert held <= HIGH + FRAME + 4096, held
        assert not done.is_set()
        # The I/O thread never blocks: it queues past the mark.
        a.on_io(lambda: a.rt.send(b.tcp, note("from the I/O thread"), payload))
        assert _outbound(a, "b") > held
        _resume_inbound(b)
        t.join(TIMEOUT)
        assert done.is_set()
        got = [b.got.get(timeout=TIMEOUT)[1] for _ in range(n + 1)]
        # Per-sender order is kept; the I/O thread's frame went ahead of those not sent yet.
        flooded = [x for x in got if x != "from the I/O thread"]
        assert flooded == [str(i) for i in range(n)]
        assert len(got) == n + 1


def test_a_blocked_sender_gives_up_when_its_peer_is_lost(nodes) -> None:
    with danaus.config.configured(send_high_water=HIGH, send_low_water=LOW):
        a, b = nodes("a"), nodes("b")
        a.rt.send(b.tcp, note("hello"))
        assert b.got.get(timeout=TIMEOUT) == (KIND, "hello")
        _pause_inbound(b)
        errors: list[BaseException] = []

        def flood() -> None:
            try:
                for i in range(1024):
                    a.rt.send(b.tcp, note(str(i)), bytes(FRAME))
            except SupervisionError as e:
                errors.append(e)

        t = threading.Thread(target=flood)
        t.start()
        wait_until(lambda: a.rt.backpressure.room_waiters == 1, TIMEOUT, "the sender blocks")
        b.on_io(lambda: [c.fail_now("the test cuts it") for c in list(b.rt.links.incoming)])
        t.join(TIMEOUT)
        assert not t.is_alive()
        assert len(errors) == 1 and "unreachable" in str(errors[0]), errors


class _GateRuntime:
    """What a Gate uses of a runtime: pausing the connection being delivered, with a
    hook that runs inside the pause (another thread acting in that window)."""

    def __init__(self, during_pause: Any) -> None:
        self.during_pause = during_pause
        self.holding: set[Any] = set()
        self.resumed: list[Any] = []

    def pause_delivering(self, gate: Any) -> str:
        self.during_pause()
        self.holding.add(gate)
        return "conn"

    def resume_reading(self, conns: list[Any], gate: Any) -> None:
        self.resumed.extend(conns)


def _gate(rt: _GateRuntime, exempt: Any) -> Gate:
    with danaus.config.configured(inbox_high_water=HIGH, inbox_low_water=LOW):
        return Gate(rt, exempt, high="inbox_high_water", low="inbox_low_water")  # type: ignore[arg-type]


def test_a_consumer_that_begins_to_wait_while_its_gate_pauses_is_not_left_paused() -> None:
    # The consumer's thread begins to wait after the gate checked it could consume and
    # before the gate counts as holding: it sees no holding gate, so it asks nobody to
    # let go. The gate must see the wait itself, or nothing ever resumes the connection
    # (an actor flooding itself hung like this, 1 CI run in 5).
    waiting = False

    def consumer_begins_to_wait() -> None:
        nonlocal waiting
        waiting = True
        assert not rt.holding  # what begin_wait reads: nothing to let go of

    rt = _GateRuntime(consumer_begins_to_wait)
    gate = _gate(rt, lambda: waiting)
    gate.arrived(2 * HIGH)
    assert rt.resumed == ["conn"] and not gate.holding


def test_a_gate_over_its_mark_pauses_while_its_consumer_can_consume() -> None:
    rt = _GateRuntime(lambda: None)
    gate = _gate(rt, lambda: False)
    gate.arrived(HIGH)
    assert not gate.holding  # at the mark, not over it
    gate.arrived(1)
    assert gate.holding and rt.resumed == []
    gate.taken(HIGH + 1 - LOW)
    assert rt.resumed == ["conn"] and not gate.holding


# -- actors: a slow consumer, memory measured -----------------------------------------


def _rss() -> tuple[int, int]:
    """(current, peak) resident bytes of this process."""
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = int(rest.split()[0]) * 1024
    return fields["VmRSS"], fields["VmHWM"]


def _reset_peak() -> int:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS
    return _rss()[0]


def _small_marks(high: int, low: int) -> None:
    danaus.config.configure(
        send_high_water=high, send_low_water=low, inbox_high_water=high, inbox_low_water=low
    )


class Consumer(Actor):
    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.got = 0
        self.base = 0

    @endpoint
    def start(self) -> None:
        self.base = _reset_peak()

    @endpoint
    def eat(self, arr: Any) -> None:
        time.sleep(self.delay)  # a slow consumer
        self.got += arr.nbytes

    @endpoint
    def eaten(self) -> tuple[int, int]:
        """(bytes eaten, peak resident growth since start())."""
        return self.got, _rss()[1] - self.base


class Producer(Actor):
    @endpoint
    def produce(self, consumer: Any, total: int, size: int) -> tuple[int, int, int]:
        arr = np.ones(size, dtype=np.uint8)
        base = _reset_peak()
        for _ in range(total // size):
            consumer.eat.broadcast(arr)  # fire and forget: nothing waits for the consumer
        # Same sender, so FIFO: answered once every message before it was eaten.
        eaten, consumer_growth = consumer.eaten.call_one().get()
        return eaten, _rss()[1] - base, consumer_growth


class AsyncProducer(Actor):
    """The same, from a coroutine: its held-back sends block its thread (docs/design.md)."""

    @endpoint
    async def produce(self, consumer: Any, total: int, size: int) -> tuple[int, int, int]:
        arr = np.ones(size, dtype=np.uint8)
        base = _reset_peak()
        for _ in range(total // size):
            consumer.eat.broadcast(arr)
        eaten, consumer_growth = await consumer.eaten.call_one()
        return eaten, _rss()[1] - base, consumer_growth


def _slow_consumer(
    total: int, size: int, high: int, delay: float, producer_cls: type = Producer
) -> None:
    pm = this_host().spawn_procs(
        per_host={"gpus": 2}, bootstrap=lambda: _small_marks(high, high // 4)
    )
    try:
        consumer = pm.slice(gpus=1).spawn("consumer", Consumer, delay)
        producer = pm.slice(gpus=0).spawn("producer", producer_cls)
        consumer.start.call_one().get(timeout=TIMEOUT)
        eaten, producer_growth, consumer_growth = producer.produce.call_one(
            consumer, total, size
        ).get(timeout=600)
    finally:
        pm.stop().get(timeout=TIMEOUT)
    assert eaten == total
    print(
        f"sent {total >> 20} MiB in {size >> 20} MiB messages: producer grew "
        f"{producer_growth >> 20} MiB, consumer {consumer_growth >> 20} MiB"
    )
    # Bounded by the marks and a few messages in flight, not by what was sent: without
    # backpressure the consumer's inbox holds most of ``total``.
    bound = 8 * size
    assert producer_growth < bound, (producer_growth, bound)
    assert consumer_growth < bound, (consumer_growth, bound)


@pytest.mark.timeout(600)
@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux /proc")
def test_two_gib_to_a_slow_consumer_keeps_memory_bounded() -> None:
    # 2 GiB in 32 MiB messages, marks of 64 MiB: about 10 s here (in the default run,
    # as the issue asks); the bound is 8 messages, an eighth of what is sent.
    _slow_consumer(total=2048 * MiB, size=32 * MiB, high=64 * MiB, delay=0.02)


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux /proc")
def test_an_async_sender_to_a_slow_consumer_is_held_back_too() -> None:
    # 256 MiB in 8 MiB messages from a coroutine, marks of 16 MiB.
    _slow_consumer(
        total=256 * MiB, size=8 * MiB, high=16 * MiB, delay=0.02, producer_cls=AsyncProducer
    )


# -- no deadlock: actors flooding each other, themselves, a port ----------------------


class Flooder(Actor):
    def __init__(self) -> None:
        self.got = 0

    @endpoint
    def take(self, arr: Any) -> None:
        self.got += 1

    @endpoint
    def flood(self, other: Any, n: int, size: int) -> int:
        arr = np.zeros(size, dtype=np.uint8)
        for _ in range(n):
            other.take.broadcast(arr)
        return n

    @endpoint
    def count(self) -> int:
        return self.got

    @endpoint
    def to_port(self, port: Any, n: int, size: int) -> int:
        for i in range(n):
            port.send((i, np.zeros(size, dtype=np.uint8)))
        return n


@pytest.fixture(scope="module")
def flooders():
    pm = this_host().spawn_procs(per_host={"gpus": 2}, bootstrap=lambda: _small_marks(HIGH, LOW))
    a = pm.slice(gpus=0).spawn("a", Flooder)
    b = pm.slice(gpus=1).spawn("b", Flooder)
    yield a, b
    pm.stop().get(timeout=TIMEOUT)


def test_two_actors_flooding_each_other_do_not_deadlock(flooders) -> None:
    a, b = flooders
    n, size = 64, 256 << 10  # 16 MiB each way, 16x the marks; neither reads while it sends
    before_a, before_b = a.count.call_one().get(timeout=TIMEOUT), b.count.call_one().get()
    fa = a.flood.call_one(b, n, size)
    fb = b.flood.call_one(a, n, size)
    assert fa.get(timeout=60) == n and fb.get(timeout=60) == n
    # Sent by the other actor, counted by a call of ours: two senders, no order between them.
    wait_until(
        lambda: a.count.call_one().get(timeout=TIMEOUT) - before_a == n, TIMEOUT, "a took all"
    )
    wait_until(
        lambda: b.count.call_one().get(timeout=TIMEOUT) - before_b == n, TIMEOUT, "b took all"
    )


def test_an_actor_flooding_itself_does_not_deadlock(flooders) -> None:
    a, _ = flooders
    before = a.count.call_one().get(timeout=TIMEOUT)
    assert a.flood.call_one(a, 64, 256 << 10).get(timeout=60) == 64
    # Its own messages and the client's calls come on different connections: no order.
    wait_until(
        lambda: a.count.call_one().get(timeout=TIMEOUT) - before == 64, TIMEOUT, "all are taken"
    )


def test_a_full_port_receiver_does_not_block_a_reply_from_the_same_proc(flooders) -> None:
    a, _ = flooders
    port, receiver = Channel.open()
    n, size = 32, 256 << 10  # 8 MiB on a port nobody reads yet
    with danaus.config.configured(inbox_high_water=HIGH, inbox_low_water=LOW):
        fut = a.to_port.call_one(port, n, size)
        # Waiting for the reply (which travels behind the port's bytes) must not hang.
        assert fut.get(timeout=60) == n
        assert a.count.call_one().get(timeout=TIMEOUT) >= 0
        got = [receiver.recv().get(timeout=TIMEOUT)[0] for _ in range(n)]
    assert got == list(range(n))
