"""Fakes for the actor core's parts: what they need of their proc, recorded."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from danaus._runtime.messaging.metrics import Observing, Recent
from danaus._wire.ids import ActorId, PortId, ProcId
from danaus._wire.protocol import Call, Kind, Message

PROC = ProcId("p0", "unix:/nowhere/p0")
CALLER = ProcId("client", "unix:/nowhere/client")
ME = ActorId(PROC, "counter.1", 0)


class FakeHost:
    """The runtime as an inbox, a fate and a meter see it: every call recorded."""

    def __init__(self, recent: Recent | None = None) -> None:
        self.observing = Observing(True, 10, 1_000_000)  # the meter's (metrics.Observing)
        self.observing.recent = recent
        self.tracer: Any = None
        self.events: list[tuple[Any, ...]] = []
        self.paused: list[Any] = []  # the gates pause_delivering was asked for
        self.resumed: list[list[Any]] = []
        self.on_flush: Callable[[], None] | None = None
        self.reader: Any = None

    # flow control (flow.GateHost)
    def pause_delivering(self, gate: Any) -> Any:
        conn = f"conn{len(self.paused)}"
        self.paused.append(gate)
        return conn

    def resume_reading(self, conns: list[Any], gate: Any) -> None:
        self.resumed.append(list(conns))

    # waits (future.Waits)
    def begin_wait(self) -> None:
        self.events.append(("begin_wait",))

    def end_wait(self) -> None:
        self.events.append(("end_wait",))

    def reader_for(self, proc: ProcId) -> Any:
        return self.reader

    def flush_held(self) -> None:
        self.events.append(("flush_held",))
        if self.on_flush is not None:
            self.on_flush()

    # replies and reports (failing.Fate)
    def reply(self, port: PortId, slot: int, status: int, value: Any) -> int:
        self.events.append(("reply", port, slot, status, value))
        return 7

    def send(self, proc: ProcId, header: Any, on_fail: Any = None) -> None:
        self.events.append(("send", proc, header))

    def bounce(self, sender: Any, what: str, why: str) -> None:
        self.events.append(("bounce", sender, what, why))

    def replies(self) -> list[tuple[Any, ...]]:
        return [e for e in self.events if e[0] == "reply"]


def call_frame(
    method: str = "incr",
    *,
    slot: int = 0,
    port: PortId | None = PortId(CALLER, 5),
    chain: tuple[ActorId, ...] = (),
    sizes: tuple[int, ...] = (1,),
    body: bytes = b"x" * 10,
    sender: ActorId | None = None,
) -> Message:
    """A received CALL frame to ``counter.1[0]`` with a ``body`` of that many bytes."""
    header = Call("counter.1", 0, method, port, slot, ("gpus",), sizes, sender, chain, 0)
    return Message(Kind.CALL, header, memoryview(body), [])


@pytest.fixture
def host() -> FakeHost:
    return FakeHost()
