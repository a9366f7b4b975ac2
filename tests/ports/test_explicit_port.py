"""``@endpoint(explicit_response_port=True)``: the endpoint answers through a port (issue 6).

The caller uses the ordinary adverbs; the endpoint may answer later, from
another message. If it raises instead of answering, the actor fails: the caller
gets ``SupervisionError`` and the owner a ``MeshFailure``.
"""

from __future__ import annotations

from typing import Any

import pytest

from danaus.actor import (
    Actor,
    Port,
    ProcMesh,
    SupervisionError,
    current_rank,
    endpoint,
)

from .conftest import TIMEOUT


class Deferred(Actor):
    def __init__(self) -> None:
        self.parked: list[tuple[Port[Any], int]] = []

    @endpoint(explicit_response_port=True)
    def double_later(self, port: Port[int], x: int) -> None:
        self.parked.append((port, x))

    @endpoint
    def release(self) -> int:
        parked, self.parked = self.parked, []
        for port, x in parked:
            port.send(2 * x + current_rank().rank)
        return len(parked)

    @endpoint(explicit_response_port=True)
    def answer_now(self, port: Port[str], text: str) -> None:
        port.send(text.upper())

    @endpoint(explicit_response_port=True)
    def raise_instead(self, port: Port[int]) -> None:
        raise ValueError("forgot to answer")

    @endpoint
    def ping(self) -> str:
        return "pong"


@pytest.fixture
def deferred(procs: ProcMesh) -> Any:
    mesh = procs.spawn("deferred", Deferred)
    mesh.initialized.get(timeout=TIMEOUT)
    yield mesh
    mesh.stop().get(timeout=TIMEOUT)


def test_an_explicit_port_endpoint_answers_through_the_normal_adverbs(deferred) -> None:
    assert deferred.slice(gpus=0).answer_now.call_one("hi").get(timeout=TIMEOUT) == "HI"
    assert list(deferred.answer_now.call("ab").get(timeout=TIMEOUT).values()) == ["AB", "AB"]
    assert deferred.answer_now.choose("c").get(timeout=TIMEOUT) == "C"


def test_an_explicit_port_endpoint_can_answer_after_a_later_message(deferred) -> None:
    one = deferred.slice(gpus=1)
    pending = one.double_later.call_one(21)
    assert one.release.call_one().get(timeout=TIMEOUT) == 1  # the later message
    assert pending.get(timeout=TIMEOUT) == 42


def test_each_rank_answers_its_own_port_in_a_call_to_the_whole_mesh(deferred) -> None:
    pending = deferred.double_later.call(10)
    assert list(deferred.release.call().get(timeout=TIMEOUT).values()) == [1, 1]
    assert list(pending.get(timeout=TIMEOUT).values()) == [20, 21]


def test_an_explicit_port_endpoint_that_raises_fails_the_actor(deferred, faults) -> None:
    with pytest.raises(SupervisionError) as info:
        deferred.slice(gpus=1).raise_instead.call_one().get(timeout=TIMEOUT)
    assert "forgot to answer" in str(info.value)
    (failure,) = faults.wait(1)
    assert failure.mesh_name == "deferred"
    assert failure.crashed_ranks == [1]
    assert "forgot to answer" in failure.reason
    with pytest.raises(SupervisionError):
        deferred.slice(gpus=1).ping.call_one().get(timeout=TIMEOUT)
    assert deferred.slice(gpus=0).ping.call_one().get(timeout=TIMEOUT) == "pong"


def test_an_explicit_port_endpoint_that_raises_in_a_broadcast_fails_the_actor(
    deferred, faults
) -> None:
    deferred.slice(gpus=0).raise_instead.broadcast()
    (failure,) = faults.wait(1)
    assert (failure.mesh_name, failure.crashed_ranks) == ("deferred", [0])
