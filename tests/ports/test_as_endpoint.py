"""Calling methods through a mesh: ``as_endpoint``, non-endpoints, reserved names (issue 6)."""

from __future__ import annotations

from typing import Any

import pytest

from danaus.actor import Actor, Port, ProcMesh, as_endpoint, endpoint

from .conftest import TIMEOUT


class Helperful(Actor):
    def __init__(self) -> None:
        self.base = 100

    @endpoint
    def ping(self) -> str:
        return "pong"

    def helper(self, x: int, *, plus: int = 0) -> int:
        return self.base + x + plus

    def helper_with_port(self, port: Port[int], x: int) -> None:
        port.send(x * 3)


@pytest.fixture(scope="module")
def helpful(procs: ProcMesh) -> Any:
    mesh = procs.spawn("helpful", Helperful)
    mesh.initialized.get(timeout=TIMEOUT)
    return mesh


def test_as_endpoint_makes_a_plain_method_callable_with_every_adverb(helpful) -> None:
    ep = as_endpoint(helpful.helper)
    assert list(ep.call(1, plus=2).get(timeout=TIMEOUT).values()) == [103, 103]
    assert as_endpoint(helpful.slice(gpus=1).helper).call_one(5).get(timeout=TIMEOUT) == 105
    assert ep.choose(0).get(timeout=TIMEOUT) == 100
    assert sorted(f.get(timeout=TIMEOUT) for f in ep.stream(4)) == [104, 104]


def test_as_endpoint_with_an_explicit_response_port(helpful) -> None:
    ep = as_endpoint(helpful.slice(gpus=0).helper_with_port, explicit_response_port=True)
    assert ep.call_one(7).get(timeout=TIMEOUT) == 21


def test_as_endpoint_checks_arguments_before_sending(helpful) -> None:
    with pytest.raises(TypeError):
        as_endpoint(helpful.helper).call(1, 2, 3)


def test_as_endpoint_of_an_endpoint_is_that_endpoint(helpful) -> None:
    assert as_endpoint(helpful.ping).call_one is not None
    assert as_endpoint(helpful.slice(gpus=0).ping).call_one().get(timeout=TIMEOUT) == "pong"


@pytest.mark.parametrize("adverb", ["call", "call_one", "choose", "stream", "broadcast"])
def test_an_adverb_of_a_non_endpoint_is_an_attribute_error_saying_it_is_not_an_endpoint(
    helpful, adverb: str
) -> None:
    # Monarch's NotAnEndpoint has no adverbs: AttributeError, here with the reason
    with pytest.raises(AttributeError, match="not annotated as an endpoint"):
        getattr(helpful.helper, adverb)(1)


def test_calling_a_non_endpoint_through_a_mesh_raises_runtime_error(helpful) -> None:
    with pytest.raises(RuntimeError, match="not annotated as an endpoint"):
        helpful.helper(1)
    assert not hasattr(helpful.helper, "no_such_thing")


def test_as_endpoint_refuses_what_is_not_a_mesh_method() -> None:
    with pytest.raises(TypeError):
        as_endpoint(Helperful.helper)


class SliceClash(Actor):
    @endpoint
    def slice(self) -> None:  # type: ignore[override]
        pass


class StopClash(Actor):
    @endpoint
    def stop(self) -> None:
        pass


@pytest.mark.parametrize("cls", [SliceClash, StopClash], ids=["slice", "stop"])
def test_an_endpoint_named_like_a_mesh_attribute_is_refused_at_spawn(
    procs: ProcMesh, cls: type
) -> None:
    with pytest.raises(ValueError, match="named like actor mesh attributes"):
        procs.spawn("clash", cls)
