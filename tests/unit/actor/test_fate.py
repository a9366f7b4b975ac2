"""An actor's Fate: what its callers and its owner hear when an endpoint raises."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from danaus._actor.core.deadlock import closes_cycle, refuse_deadlock
from danaus._actor.core.endpoints import EndpointProperty
from danaus._actor.core.failing import Aborted, Fate, refuse_stopped
from danaus._errors import SupervisionError
from danaus._runtime.messaging.runtime import STATUS_ERROR, STATUS_EXC, STATUS_OK
from danaus._wire.ids import ActorId, PortId
from danaus._wire.protocol import Failed

from .conftest import CALLER, ME, PROC, FakeHost, call_frame

OWNER = ActorId(CALLER, "client", 0)
PORT = PortId(CALLER, 9)


def body(self: Any) -> None: ...


@pytest.fixture
def fate(host: FakeHost) -> Fate:
    return Fate(host, "counter.1", 0, OWNER)  # type: ignore[arg-type]


def test_an_exception_with_a_caller_is_the_callers_and_the_actor_lives_on(
    host: FakeHost, fate: Fate
) -> None:
    fate.raised(ValueError("bad"), EndpointProperty(body), PORT, 3, stopping=False)
    ((_, port, slot, status, (exc, tb)),) = host.replies()
    assert (port, slot, status) == (PORT, 3, STATUS_EXC)
    assert isinstance(exc, ValueError) and "ValueError: bad" in tb
    assert fate.failed is None


def test_an_exception_in_a_broadcast_fails_the_actor_and_its_owner_hears(
    host: FakeHost, fate: Fate
) -> None:
    fate.raised(ValueError("bad"), EndpointProperty(body), None, 0, stopping=False)
    assert fate.failed is not None and "no reply (broadcast)" in fate.failed
    assert isinstance(fate.fail_exc, ValueError)
    ((kind, proc, report),) = host.events
    assert kind == "send" and proc == CALLER
    assert isinstance(report, Failed) and report.reason == fate.failed
    # Failing again changes nothing: the first reason wins, reported once.
    fate.fail("again", "")
    assert "broadcast" in fate.failed and len(host.events) == 1


def test_a_failed_actors_calls_get_supervision_errors_naming_it(host: FakeHost, fate: Fate) -> None:
    fate.raised(Aborted("enough"), EndpointProperty(body), PORT, 1, stopping=False)
    assert fate.failed == "actor counter.1[0] aborted: enough"
    (_, port, slot, status, err) = host.replies()[0]
    assert (port, slot, status) == (PORT, 1, STATUS_ERROR)
    assert isinstance(err, SupervisionError)
    assert "counter.1[0] and all its descendants have failed" in str(err)


def test_a_body_cancelled_by_the_stop_is_answered_was_stopped(host: FakeHost, fate: Fate) -> None:
    fate.raised(asyncio.CancelledError(), EndpointProperty(body), PORT, 2, stopping=True)
    (_, _, _, status, err) = host.replies()[0]
    assert status == STATUS_ERROR and "was stopped" in str(err)
    assert fate.failed is None


def test_an_explicit_port_endpoint_that_raises_fails_the_actor(host: FakeHost, fate: Fate) -> None:
    prop = EndpointProperty(lambda self, port: None, explicit_response_port=True)
    fate.raised(KeyError("k"), prop, PORT, 0, stopping=False)
    assert fate.failed is not None and "instead of answering through its response port" in (
        fate.failed
    )


def test_a_declined_supervision_and_an_unhandled_bounce_fail_the_actor(host: FakeHost) -> None:
    declined = Fate(host, "m", 0, None)  # type: ignore[arg-type]
    declined.supervised("its child failed", handled=False, error=None, has_hook=True)
    assert declined.failed == "actor m[0] failed: it declined its child failed"
    handled = Fate(host, "m", 1, None)  # type: ignore[arg-type]
    handled.supervised("its child failed", handled=True, error=None, has_hook=True)
    assert handled.failed is None

    class Envelope:
        def dest(self) -> str:
            return "x[0]"

        def error_msg(self) -> str:
            return "gone"

    bounced = Fate(host, "m", 2, None)  # type: ignore[arg-type]
    bounced.bounced(Envelope(), handled=False, error=None)  # type: ignore[arg-type]
    assert bounced.failed is not None and "to x[0] could not be delivered (gone)" in bounced.failed


def test_a_call_after_the_stop_hears_was_stopped_and_a_broadcast_comes_back(
    host: FakeHost,
) -> None:
    refuse_stopped(host, "m[0]", call_frame(slot=4).header)  # type: ignore[arg-type]
    assert host.replies()[0][2] == 4
    refuse_stopped(host, "m[0]", call_frame(port=None, sender=OWNER).header)  # type: ignore[arg-type]
    assert host.events[-1] == ("bounce", OWNER, "m[0].incr()", "the actor was stopped")


def test_a_call_closes_a_cycle_only_through_a_serial_endpoint_of_this_actor(
    host: FakeHost,
) -> None:
    serial = {"incr": EndpointProperty(body)}
    concurrent = {"incr": EndpointProperty(body, concurrent=True)}
    cycling = call_frame(chain=(OWNER, ME))
    assert closes_cycle(ME, serial, cycling)
    assert not closes_cycle(ME, concurrent, cycling)
    assert not closes_cycle(ME, serial, call_frame(chain=(OWNER,)))
    assert not closes_cycle(None, serial, cycling)
    refuse_deadlock(host, "counter.1[0]", cycling)  # type: ignore[arg-type]
    (_, _, _, status, (err, _)) = host.replies()[0]
    assert status == STATUS_EXC and isinstance(err, RuntimeError)
    assert "deadlock" in str(err) and f"{ME.mesh}[0]" in str(err)
    assert PROC.name == "p0"


def test_items_that_come_after_the_stop_are_answered_not_dropped(
    host: FakeHost, fate: Fate
) -> None:
    from danaus._actor.core.inbox import Bounced, Stop, Supervise

    fate.refuse(call_frame(slot=6))
    fate.refuse(Stop(PORT, 2, "again"))
    fate.refuse(Stop(None, 0, "no reply"))
    fate.refuse(Supervise("late"))  # logged: no one to answer
    fate.refuse(Bounced("late"))
    ((*_, slot6, status6, err), (*_, slot2, status2, value)) = host.replies()
    assert (slot6, status6) == (6, STATUS_ERROR) and "was stopped" in str(err)
    assert (slot2, status2, value) == (2, STATUS_OK, None)
