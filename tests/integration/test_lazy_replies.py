"""The I/O thread does no user-level work: replies are unpickled by their reader.

A reply whose unpickling blocks (until the test lets it go) would freeze the
client's I/O thread if that thread decoded it: here the call's future is
done, the value still undecoded, while other calls on other connections
keep answering; ``get()`` then decodes it on the calling thread. A large
reply (256 MiB, offloaded between procs of this host) is copied by the
copier thread, not the I/O loop, and no peer is lost meanwhile.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import threading
from typing import Any

import pytest

from danaus._runtime.node import this_node
from danaus.actor import Actor, ActorError, Channel, ProcMesh, endpoint, this_host
from large_blobs import lost_peers

from .conftest import REPLY_TIMEOUT

MiB = 1 << 20


_GATES: dict[str, threading.Event] = {}
_GATES_LOCK = threading.Lock()


def _gate(name: str) -> threading.Event:
    with _GATES_LOCK:
        return _GATES.setdefault(name, threading.Event())


def _rebuild(gate: str, client: int, data: Any) -> dict[str, Any]:
    """Unpickles a :class:`Blocker`: in the client, waits until ``_gate(gate)`` is set."""
    if os.getpid() == client:
        _gate(gate).wait(60)
    return {
        "thread": threading.current_thread().name,
        "size": memoryview(data).nbytes,
        "gate": gate,
    }


class Blocker:
    def __init__(self, gate: str, client: int, size: int) -> None:
        # Out of band (a PickleBuffer): between procs of a host, offloaded when large.
        self.gate, self.client = gate, client
        self.data = pickle.PickleBuffer(bytearray(size))

    def __reduce__(self) -> Any:
        return (_rebuild, (self.gate, self.client, self.data))


def _refuse() -> None:
    raise RuntimeError("this value refuses to be unpickled here")


class Unpicklable:
    def __reduce__(self) -> Any:
        return (_refuse, ())


class Replier(Actor):
    @endpoint
    def blocker(self, gate: str, client: int, size: int = 0) -> Blocker:
        return Blocker(gate, client, size)

    @endpoint
    def unpicklable(self) -> Unpicklable:
        return Unpicklable()

    @endpoint
    def echo(self, x: int) -> int:
        return x

    @endpoint
    def to_port(self, port: Any, gate: str, client: int) -> None:
        port.send(Blocker(gate, client, 0))


@pytest.fixture(scope="module")
def two() -> Any:
    pm: ProcMesh = this_host().spawn_procs(per_host={"gpus": 2})
    yield pm
    pm.stop().get(timeout=REPLY_TIMEOUT)


def _wait_done(fut: Any) -> None:
    arrived = threading.Event()
    fut.add_done_callback(lambda _: arrived.set())
    assert arrived.wait(REPLY_TIMEOUT), "the reply never reached the caller's future"


@pytest.mark.parametrize("size", [0, 256 * MiB], ids=["small", "256MiB"])
def test_a_reply_is_unpickled_by_its_reader_while_other_calls_go_on(two, tmp_path, size) -> None:
    actors = two.spawn(f"lazy_{size}", Replier)
    slow, other = actors.slice(gpus=0), actors.slice(gpus=1)
    lost = lost_peers()
    rt = this_node().runtime
    copied = rt.offload.copied_off_loop
    gate = str(tmp_path / "gate")
    big = slow.blocker.call_one(gate, os.getpid(), size)
    # Its reply reached the future; had the I/O thread unpickled it, it would still
    # be stuck in _rebuild (the gate is shut) and nothing below would answer.
    _wait_done(big)
    for i in range(20):
        assert other.echo.call_one(i).get(timeout=REPLY_TIMEOUT) == i
    assert list(actors.echo.call(7).get(timeout=REPLY_TIMEOUT).values()) == [7, 7]
    _gate(gate).set()
    got = big.get(timeout=REPLY_TIMEOUT)
    assert got == {"thread": threading.current_thread().name, "size": size, "gate": gate}
    assert big.get(timeout=REPLY_TIMEOUT) is got  # decoded once
    if size and rt.offload.enabled and rt.offload.ok_peers:
        assert rt.offload.copied_off_loop - copied >= size  # by the copier thread
    assert lost == []


def test_a_value_sent_on_a_port_is_unpickled_by_the_receiver(two, tmp_path) -> None:
    actors = two.spawn("lazy_port", Replier)
    gate = str(tmp_path / "gate")
    port, receiver = Channel.open()
    actors.slice(gpus=0).to_port.call_one(port, gate, os.getpid()).get(timeout=REPLY_TIMEOUT)
    nxt = receiver.recv()
    _wait_done(nxt)
    assert actors.slice(gpus=1).echo.call_one(5).get(timeout=REPLY_TIMEOUT) == 5
    _gate(gate).set()
    assert nxt.get(timeout=REPLY_TIMEOUT)["thread"] == threading.current_thread().name


def test_an_awaited_reply_is_unpickled_on_the_awaiting_loop(two, tmp_path) -> None:
    actors = two.spawn("lazy_await", Replier)
    gate = str(tmp_path / "gate")
    _gate(gate).set()

    async def main() -> Any:
        return await actors.slice(gpus=0).blocker.call_one(gate, os.getpid())

    threads: list[str] = []
    t = threading.Thread(target=lambda: threads.append(asyncio.run(main())["thread"]), name="aw")
    t.start()
    t.join(REPLY_TIMEOUT)
    assert threads == ["aw"]


def test_an_unpicklable_reply_reaches_the_caller_with_a_clear_error(two) -> None:
    actors = two.spawn("lazy_unpicklable", Replier)
    with pytest.raises(ActorError, match="could not be unpickled here") as info:
        actors.slice(gpus=0).unpicklable.call_one().get(timeout=REPLY_TIMEOUT)
    assert "refuses to be unpickled" in str(info.value)
    with pytest.raises(ActorError, match="could not be unpickled here"):
        actors.unpicklable.call().get(timeout=REPLY_TIMEOUT)
    # The actors and the connections are fine.
    assert list(actors.echo.call(1).get(timeout=REPLY_TIMEOUT).values()) == [1, 1]
