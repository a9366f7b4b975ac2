"""Undeliverable messages come back to the actor that sent them (issue 6).

``_handle_undeliverable_message(envelope)`` returning True swallows the
problem; without the handler (or when it returns False) the sender fails and
its owner gets a ``MeshFailure``.
"""

from __future__ import annotations

from typing import Any

import pytest

from danaus.actor import (
    Actor,
    Channel,
    Port,
    ProcMesh,
    SupervisionError,
    endpoint,
)

from .conftest import TIMEOUT


class Target(Actor):
    @endpoint
    def ping(self) -> str:
        return "pong"


class Forwarder(Actor):
    """Sends where it is told; has no undeliverable-message handler."""

    def __init__(self, report: Port[Any] | None = None) -> None:
        self.report = report

    @endpoint
    def poke(self, target: Any) -> None:
        target.ping.broadcast()

    @endpoint
    def send_to(self, port: Port[Any], value: Any) -> None:
        port.send(value)

    @endpoint
    def send_quietly(self, port: Port[Any], value: Any) -> None:
        port.return_undeliverable = False
        port.send(value)

    @endpoint
    def ping(self) -> str:
        return "alive"


class HandlingForwarder(Forwarder):
    def _handle_undeliverable_message(self, envelope: Any) -> bool:
        assert self.report is not None
        self.report.send((envelope.dest(), envelope.error_msg(), str(envelope.sender())))
        return True


class DecliningForwarder(Forwarder):
    def _handle_undeliverable_message(self, envelope: Any) -> bool:
        return False


@pytest.fixture
def stopped_target(procs: ProcMesh) -> Any:
    target = procs.slice(gpus=1).spawn("target", Target)
    target.initialized.get(timeout=TIMEOUT)
    target.stop().get(timeout=TIMEOUT)
    return target


def spawn_forwarder(procs: ProcMesh, cls: type) -> tuple[Any, Any]:
    report, receiver = Channel.open()
    forwarder = procs.slice(gpus=0).spawn("forwarder", cls, report)
    forwarder.initialized.get(timeout=TIMEOUT)
    return forwarder, receiver


def test_a_broadcast_to_a_stopped_actor_comes_back_to_a_handler_that_survives_it(
    procs, stopped_target
) -> None:
    forwarder, reports = spawn_forwarder(procs, HandlingForwarder)
    forwarder.poke.call_one(stopped_target).get(timeout=TIMEOUT)
    dest, error, sender = reports.recv().get(timeout=TIMEOUT)
    assert "target" in dest and "ping" in dest
    assert "stopped" in error
    assert "forwarder" in sender
    assert forwarder.ping.call_one().get(timeout=TIMEOUT) == "alive"
    forwarder.stop().get(timeout=TIMEOUT)


def test_a_send_to_a_closed_port_comes_back_to_a_handler_that_survives_it(procs) -> None:
    forwarder, reports = spawn_forwarder(procs, HandlingForwarder)
    port, receiver = Channel.open()
    receiver.close()
    forwarder.send_to.call_one(port, "lost").get(timeout=TIMEOUT)
    dest, error, _ = reports.recv().get(timeout=TIMEOUT)
    assert "port" in dest
    assert "closed" in error
    assert forwarder.ping.call_one().get(timeout=TIMEOUT) == "alive"
    forwarder.stop().get(timeout=TIMEOUT)


@pytest.mark.parametrize("cls", [Forwarder, DecliningForwarder], ids=["no_handler", "declines"])
def test_an_undeliverable_message_not_handled_fails_the_sender(
    procs, stopped_target, faults, cls: type
) -> None:
    forwarder, _ = spawn_forwarder(procs, cls)
    forwarder.poke.call_one(stopped_target).get(timeout=TIMEOUT)
    (failure,) = faults.wait(1)
    assert (failure.mesh_name, failure.crashed_ranks) == ("forwarder", [0])
    assert "could not be delivered" in failure.reason
    assert "target" in failure.reason
    with pytest.raises(SupervisionError):
        forwarder.ping.call_one().get(timeout=TIMEOUT)


def test_a_send_to_a_closed_port_without_a_handler_fails_the_sender(procs, faults) -> None:
    forwarder, _ = spawn_forwarder(procs, Forwarder)
    port, receiver = Channel.open()
    receiver.close()
    forwarder.send_to.call_one(port, "lost").get(timeout=TIMEOUT)
    (failure,) = faults.wait(1)
    assert failure.mesh_name == "forwarder"
    assert "could not be delivered" in failure.reason


def test_a_port_that_does_not_return_undeliverable_messages_drops_them(procs) -> None:
    forwarder, _ = spawn_forwarder(procs, Forwarder)
    port, receiver = Channel.open()
    receiver.close()
    forwarder.send_quietly.call_one(port, "dropped").get(timeout=TIMEOUT)
    # A bounce would reach the forwarder before this call (same connection, sent
    # earlier) and fail it.
    assert forwarder.ping.call_one().get(timeout=TIMEOUT) == "alive"
    forwarder.stop().get(timeout=TIMEOUT)


class PortOpener(Actor):
    """Opens channels in its own proc and hands out only their ports."""

    def __init__(self) -> None:
        self.kept: list[Any] = []

    @endpoint
    def open_and_drop(self) -> Port[Any]:
        port, _receiver = Channel.open()  # the receiver is garbage once this returns
        return port

    @endpoint
    def open_and_keep(self) -> Port[Any]:
        port, receiver = Channel.open()
        self.kept.append(receiver)
        return port


def test_a_send_to_the_port_of_a_garbage_collected_receiver_comes_back(procs) -> None:
    opener = procs.slice(gpus=1).spawn("opener", PortOpener)
    forwarder, reports = spawn_forwarder(procs, HandlingForwarder)
    port = opener.open_and_drop.call_one().get(timeout=TIMEOUT)
    forwarder.send_to.call_one(port, "lost").get(timeout=TIMEOUT)
    dest, error, _ = reports.recv().get(timeout=TIMEOUT)
    assert "port" in dest
    assert "closed" in error
    forwarder.stop().get(timeout=TIMEOUT)
    opener.stop().get(timeout=TIMEOUT)


def test_a_send_to_a_port_whose_owning_actor_stopped_comes_back(procs) -> None:
    opener = procs.slice(gpus=1).spawn("opener", PortOpener)
    forwarder, reports = spawn_forwarder(procs, HandlingForwarder)
    port = opener.open_and_keep.call_one().get(timeout=TIMEOUT)
    opener.stop().get(timeout=TIMEOUT)
    forwarder.send_to.call_one(port, "lost").get(timeout=TIMEOUT)
    dest, error, _ = reports.recv().get(timeout=TIMEOUT)
    assert "port" in dest
    assert "closed" in error
    forwarder.stop().get(timeout=TIMEOUT)


def test_a_send_to_a_port_whose_owning_actor_stopped_fails_a_sender_without_handler(
    procs, faults
) -> None:
    opener = procs.slice(gpus=1).spawn("opener", PortOpener)
    forwarder, _ = spawn_forwarder(procs, Forwarder)
    port = opener.open_and_keep.call_one().get(timeout=TIMEOUT)
    opener.stop().get(timeout=TIMEOUT)
    forwarder.send_to.call_one(port, "lost").get(timeout=TIMEOUT)
    (failure,) = faults.wait(1)
    assert failure.mesh_name == "forwarder"
    assert "could not be delivered" in failure.reason
