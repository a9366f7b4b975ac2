"""``@concurrent_endpoint``: async bodies that may overlap later messages (issue 6).

An actor handles one message at a time, so two actors that call each other
re-entrantly deadlock — unless the endpoint re-entered is concurrent. danaus
detects such a cycle and answers the call with an error that says "deadlock"
instead of hanging.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from danaus.actor import Actor, ActorError, ProcMesh, concurrent_endpoint, endpoint

from .conftest import TIMEOUT


class Gate(Actor):
    def __init__(self) -> None:
        self.gate = asyncio.Event()

    @concurrent_endpoint
    async def wait_for_gate(self) -> str:
        await asyncio.wait_for(self.gate.wait(), TIMEOUT)
        return "passed"

    @concurrent_endpoint
    async def open_gate(self) -> str:
        self.gate.set()
        return "opened"

    @endpoint
    async def serial_open_gate(self) -> str:
        self.gate.set()
        return "opened"


@pytest.fixture
def gates(procs: ProcMesh) -> Any:
    mesh = procs.slice(gpus=0).spawn("gates", Gate)
    mesh.initialized.get(timeout=TIMEOUT)
    yield mesh
    mesh.stop().get(timeout=TIMEOUT)


def test_concurrent_endpoint_bodies_overlap_a_later_message(gates) -> None:
    waiting = gates.wait_for_gate.call_one()
    # Without overlap the first body would wait forever (well, until its timeout):
    # only the second message can open the gate.
    assert gates.open_gate.call_one().get(timeout=TIMEOUT) == "opened"
    assert waiting.get(timeout=TIMEOUT) == "passed"


def test_an_ordinary_endpoint_runs_while_a_concurrent_body_waits(gates) -> None:
    waiting = gates.wait_for_gate.call_one()
    assert gates.serial_open_gate.call_one().get(timeout=TIMEOUT) == "opened"
    assert waiting.get(timeout=TIMEOUT) == "passed"


def test_concurrent_endpoint_refuses_a_sync_function() -> None:
    with pytest.raises(ValueError, match="can only wrap async endpoints"):

        class Bad(Actor):
            @concurrent_endpoint
            def work(self) -> None:
                pass


def test_concurrent_endpoint_refuses_to_wrap_an_endpoint() -> None:
    with pytest.raises(ValueError, match="does not wrap @endpoint"):

        class Bad(Actor):
            @concurrent_endpoint
            @endpoint
            async def work(self) -> None:
                pass


# -- ping-pong between two meshes ------------------------------------------------


class Pinger(Actor):
    """``play`` calls the ponger, which calls back ``echo`` while ``play`` is waiting."""

    @endpoint
    async def play(self, ponger: Any, me: Any, rounds: int) -> list[int]:
        return [await ponger.pong.call_one(me, i) for i in range(rounds)]

    @concurrent_endpoint
    async def echo(self, i: int) -> int:
        return i * 10


class SerialPinger(Actor):
    """The same, but ``echo`` is an ordinary endpoint: the call back cannot run."""

    @endpoint
    async def play(self, ponger: Any, me: Any, rounds: int) -> list[int]:
        return [await ponger.pong.call_one(me, i) for i in range(rounds)]

    @endpoint
    async def echo(self, i: int) -> int:
        return i * 10


class SyncSerialPinger(Actor):
    """A sync actor blocked in ``Future.get()`` while the call comes back."""

    @endpoint
    def play(self, ponger: Any, me: Any, rounds: int) -> list[int]:
        return [ponger.pong.call_one(me, i).get(timeout=TIMEOUT) for i in range(rounds)]

    @endpoint
    def echo(self, i: int) -> int:
        return i * 10


class Ponger(Actor):
    @endpoint
    async def pong(self, pinger: Any, i: int) -> int:
        return 1 + await pinger.echo.call_one(i)


def spawn_pair(procs: ProcMesh, pinger_cls: type) -> tuple[Any, Any]:
    pinger = procs.slice(gpus=0).spawn("pinger", pinger_cls)
    ponger = procs.slice(gpus=1).spawn("ponger", Ponger)
    pinger.initialized.get(timeout=TIMEOUT)
    ponger.initialized.get(timeout=TIMEOUT)
    return pinger, ponger


def test_ping_pong_between_two_meshes_works_when_the_reentered_side_is_concurrent(
    procs,
) -> None:
    pinger, ponger = spawn_pair(procs, Pinger)
    try:
        assert pinger.play.call_one(ponger, pinger, 5).get(timeout=TIMEOUT) == [1, 11, 21, 31, 41]
    finally:
        pinger.stop().get(timeout=TIMEOUT)
        ponger.stop().get(timeout=TIMEOUT)


@pytest.mark.parametrize("pinger_cls", [SerialPinger, SyncSerialPinger], ids=["async", "sync"])
def test_a_reentrant_cycle_without_concurrency_is_reported_as_a_deadlock(
    procs, pinger_cls: type
) -> None:
    pinger, ponger = spawn_pair(procs, pinger_cls)
    try:
        with pytest.raises(ActorError) as info:
            pinger.play.call_one(ponger, pinger, 1).get(timeout=TIMEOUT)
        assert "deadlock" in str(info.value)
        # Neither actor is harmed: both keep answering.
        assert pinger.echo.call_one(2).get(timeout=TIMEOUT) == 20
        assert ponger.pong.call_one(pinger, 3).get(timeout=TIMEOUT) == 31
    finally:
        pinger.stop().get(timeout=TIMEOUT)
        ponger.stop().get(timeout=TIMEOUT)
