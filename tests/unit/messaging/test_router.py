"""The router part alone: ports, replies, mailboxes and early calls, with callables."""

from __future__ import annotations

from typing import Any

from danaus._runtime.messaging.routing import Router
from danaus._wire.ids import ActorId, PortId, ProcId
from danaus._wire.protocol import Call, Kind, Message, Reply

ME = ProcId("p0", "unix:/nowhere/p0.sock")


class FakeLoop:
    """Records what the router schedules, for the test to run by hand."""

    def __init__(self) -> None:
        self.later: list[tuple[float, Any, tuple[Any, ...]]] = []

    def call_later(self, delay: float, fn: Any, *args: Any) -> None:
        self.later.append((delay, fn, args))


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def __call__(self, *args: Any) -> None:
        self.calls.append(args)


class Port:
    def __init__(self) -> None:
        self.frames: list[Message] = []

    def deliver(self, frame: Message) -> None:
        self.frames.append(frame)

    def peer_lost(self, proc: str, reason: str) -> None:
        pass


class Box:
    def __init__(self) -> None:
        self.got: list[tuple[Message, ProcId | None]] = []

    def deliver(self, frame: Message, via: ProcId | None) -> None:
        self.got.append((frame, via))


def router() -> tuple[Router, FakeLoop, Recorder, Recorder]:
    loop, bounce, undeliverable = FakeLoop(), Recorder(), Recorder()
    return Router(loop, ME, bounce, undeliverable), loop, bounce, undeliverable  # type: ignore[arg-type]


def reply(port: int, sender: ActorId | None = None) -> Message:
    return Message(Kind.REPLY, Reply(port, 0, 0, sender), memoryview(b"x"), [])


def call(mesh: str, rank: int, port: PortId | None, sender: ActorId | None) -> Message:
    header = Call(mesh, rank, "m", port, 3, (), (), sender, (), 0)
    return Message(Kind.CALL, header, memoryview(b""), [])


def test_ports_are_numbered_on_this_proc_and_a_reply_reaches_its_port() -> None:
    r, *_ = router()
    a, b = Port(), Port()
    pa, pb = r.open_port(a), r.open_port(b)
    assert (pa.proc, pb.proc) == (ME, ME) and pa.port != pb.port
    assert isinstance(pa, PortId)
    r.on_reply(None, reply(pb.port))  # type: ignore[arg-type]
    assert (a.frames, len(b.frames)) == ([], 1)


def test_a_reply_to_a_closed_port_goes_back_to_its_sender() -> None:
    r, _, bounce, _ = router()
    no = r.open_port(Port()).port
    r.close_port(no)
    sender = ActorId(ProcId("p1", "unix:/x"), "m", 0)
    r.on_reply(None, reply(no, sender))  # type: ignore[arg-type]
    ((who, dest, reason),) = bounce.calls
    assert who == sender and dest == f"port p0:{no}" and "closed" in reason


def test_the_router_names_the_proc_it_is_told_it_is() -> None:
    r, *_ = router()
    moved = ProcId("p0", "tcp://10.0.0.1:5")
    r.me = moved  # the runtime tells it when the proc's address changes
    assert r.open_port(Port()).proc == moved


def test_a_call_that_comes_before_its_mailbox_is_held_then_delivered_in_order() -> None:
    r, loop, *_ = router()
    via = ProcId("p2", "unix:/y")
    first, second = call("m", 1, None, None), call("m", 1, None, None)
    r.deliver_call(first, via)
    r.deliver_call(second, via)
    assert len(loop.later) == 1  # one expiry for the key, not one per call
    box = Box()
    r.mailboxes[("m", 1)] = box
    r.mailbox_added(("m", 1))
    assert [f for f, _ in box.got] == [first, second]
    _, expire, args = loop.later[0]
    expire(*args)  # nothing is left to expire
    assert [f for f, _ in box.got] == [first, second]


def test_a_held_call_whose_actor_never_comes_is_answered_undeliverable() -> None:
    r, loop, bounce, undeliverable = router()
    port = PortId(ProcId("p3", "unix:/z"), 9)
    r.deliver_call(call("gone", 0, port, None), None)
    sender = ActorId(ProcId("p4", "unix:/w"), "a", 0)
    r.deliver_call(call("gone", 1, None, sender), None)
    for _, fn, args in loop.later:
        fn(*args)
    ((to, slot, reason),) = undeliverable.calls
    assert (to, slot) == (port, 3) and reason == "no actor gone[0] on proc p0"
    ((who, dest, why),) = bounce.calls
    assert who == sender and dest == "gone[1].m()" and "no actor gone[1]" in why
