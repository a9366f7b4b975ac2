"""Channels and ports: one-way mailboxes, passed to actors, ordered per sender (issue 6)."""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest

from danaus.actor import (
    Actor,
    ActorError,
    Channel,
    Port,
    PortReceiver,
    ProcMesh,
    SupervisionError,
    current_rank,
    endpoint,
    send,
    this_host,
)

from .conftest import TIMEOUT


class Sender(Actor):
    def __init__(self) -> None:
        self.port: Port[Any] | None = None

    @endpoint
    def send_many(self, port: Port[int], n: int) -> None:
        for i in range(n):
            port.send(i)

    @endpoint
    def remember(self, port: Port[Any]) -> None:
        self.port = port

    @endpoint
    def emit(self, value: Any) -> None:
        assert self.port is not None
        self.port.send(value)

    @endpoint
    def send_exception(self, port: Port[Any]) -> None:
        port.exception(KeyError("no such shard"))

    @endpoint
    def echo(self, value: Any) -> tuple[int, Any]:
        return current_rank().rank, value


@pytest.fixture(scope="module")
def senders(procs: ProcMesh) -> Any:
    mesh = procs.spawn("senders", Sender)
    mesh.initialized.get(timeout=TIMEOUT)
    return mesh


def test_channel_open_gives_a_port_and_its_receiver() -> None:
    port, receiver = Channel.open()
    assert isinstance(port, Port)
    assert isinstance(receiver, PortReceiver)
    port.send("hello")
    port.send("again")
    assert receiver.recv().get(timeout=TIMEOUT) == "hello"
    assert receiver.recv().get(timeout=TIMEOUT) == "again"


def test_a_receive_waits_for_a_later_send(senders) -> None:
    port, receiver = Channel.open()
    pending = receiver.recv()
    assert not pending.done()
    senders.slice(gpus=0).remember.call_one(port).get(timeout=TIMEOUT)
    senders.slice(gpus=0).emit.broadcast({"late": True})
    assert pending.get(timeout=TIMEOUT) == {"late": True}


def test_a_hundred_sends_from_an_actor_arrive_in_order(senders) -> None:
    port, receiver = Channel.open()
    senders.slice(gpus=1).send_many.broadcast(port, 100)
    assert [receiver.recv().get(timeout=TIMEOUT) for _ in range(100)] == list(range(100))


def test_sends_from_many_actors_all_arrive_each_sender_in_order(senders) -> None:
    port, receiver = Channel.open()
    senders.send_many.call(port, 50).get(timeout=TIMEOUT)
    got = [receiver.recv().get(timeout=TIMEOUT) for _ in range(100)]
    assert sorted(got) == sorted(list(range(50)) * 2)


def test_a_port_kept_by_an_actor_is_used_in_a_later_message(senders) -> None:
    port, receiver = Channel.open()
    one = senders.slice(gpus=1)
    one.remember.call_one(port).get(timeout=TIMEOUT)
    for value in ("a", "b", "c"):
        one.emit.broadcast(value)
    assert [receiver.recv().get(timeout=TIMEOUT) for _ in range(3)] == ["a", "b", "c"]


def test_port_exception_makes_recv_raise_that_exception(senders) -> None:
    port, receiver = Channel.open()
    senders.slice(gpus=0).send_exception.broadcast(port)
    with pytest.raises(KeyError, match="no such shard"):
        receiver.recv().get(timeout=TIMEOUT)


def test_port_exception_from_the_client_reaches_recv() -> None:
    port, receiver = Channel.open()
    port.exception(ValueError("bad batch"))
    with pytest.raises(ValueError, match="bad batch") as info:
        receiver.recv().get(timeout=TIMEOUT)
    assert not isinstance(info.value, ActorError)


def test_a_once_port_refuses_a_second_send() -> None:
    port, receiver = Channel.open(once=True)
    port.send(1)
    with pytest.raises(RuntimeError, match="once"):
        port.send(2)
    assert receiver.recv().get(timeout=TIMEOUT) == 1


def test_send_with_selection_all_sends_every_reply_to_the_port(senders) -> None:
    port, receiver = Channel.open()
    send(senders.echo, ("x",), {}, port=port, selection="all")
    got = sorted(receiver.recv().get(timeout=TIMEOUT) for _ in range(2))
    assert got == [(0, "x"), (1, "x")]


def test_send_with_selection_choose_reaches_exactly_one_actor(senders) -> None:
    port, receiver = Channel.open()
    send(senders.echo, ("chosen",), {}, port=port, selection="choose")
    first = receiver.recv().get(timeout=TIMEOUT)
    assert first[1] == "chosen"
    # Each actor's later reply follows any earlier one it sent: had two actors been
    # chosen, a second "chosen" would come before both markers.
    send(senders.echo, ("marker",), {}, port=port, selection="all")
    later = [receiver.recv().get(timeout=TIMEOUT) for _ in range(2)]
    assert sorted(later) == [(0, "marker"), (1, "marker")]


def test_send_forwards_keyword_arguments_and_without_a_port_is_fire_and_forget(
    senders,
) -> None:
    port, receiver = Channel.open()
    one = senders.slice(gpus=0)
    send(one.remember, (), {"port": port})
    send(one.emit, (), {"value": 5})
    assert receiver.recv().get(timeout=TIMEOUT) == 5


def test_send_rejects_an_unknown_selection(senders) -> None:
    port, _ = Channel.open()
    with pytest.raises(ValueError, match="'all' or 'choose'"):
        send(senders.echo, (1,), {}, port=port, selection="some")


def test_a_ranked_receiver_gives_each_reply_with_its_senders_rank(senders: Any) -> None:
    # Monarch's Channel.open_ranked / PortReceiver.ranked: (rank, value) per reply.
    port, ranked = Channel.open_ranked()
    send(senders.echo, ("hi",), {}, port=port)
    got = sorted(ranked.recv().get(timeout=TIMEOUT) for _ in range(2))
    assert got == [(0, (0, "hi")), (1, (1, "hi"))]  # the rank the port gives, the actor's own
    one = senders.slice(gpus=1)
    send(one.echo, ("one",), {}, port=port)
    assert ranked.recv().get(timeout=TIMEOUT) == (0, (0, "one"))  # ranks in the sliced mesh


def test_ranked_shares_the_receivers_messages_and_raises_what_was_sent(senders: Any) -> None:
    port, receiver = Channel.open()
    ranked = receiver.ranked()
    assert ranked.port_id == receiver.port_id
    port.send("plain")
    assert ranked.recv().get(timeout=TIMEOUT) == (0, "plain")  # a channel's own port: rank 0
    port.send("again")
    assert receiver.recv().get(timeout=TIMEOUT) == "again"  # the plain view still works
    senders.slice(gpus=0).send_exception.call_one(port).get(timeout=TIMEOUT)
    with pytest.raises(KeyError, match="no such shard"):
        ranked.recv().get(timeout=TIMEOUT)
    del receiver  # the ranked view keeps the port open
    port.send("kept")
    assert ranked.recv().get(timeout=TIMEOUT) == (0, "kept")


class PidSender(Actor):
    @endpoint
    def send_pid(self, port: Port[int]) -> None:
        port.send(os.getpid())


def test_a_receiver_watching_a_proc_fails_once_that_proc_is_lost(faults: Any) -> None:
    """The internal ``_watch`` (used by ``shell()`` and ``PortForwarder``, which wait on
    one sender): the messages already sent are taken first, then reading raises
    ``SupervisionError`` instead of waiting for a proc that is gone."""
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        sender = pm.spawn("pid_sender", PidSender)
        port, receiver = Channel[int].open()
        receiver._watch(pm._procs[0])
        sender.send_pid.call_one(port).get(timeout=TIMEOUT)
        pid = receiver.recv().get(timeout=TIMEOUT)
        waiting = receiver.recv()  # waits for a message that will never come
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(SupervisionError, match="is gone"):
            waiting.get(timeout=TIMEOUT)
        with pytest.raises(SupervisionError):  # and every later read, at once
            receiver.recv().get(timeout=TIMEOUT)
        faults.wait(1)  # the mesh on the killed proc is reported to its owner
    finally:
        pm.stop().get(timeout=TIMEOUT)
