"""A tour of danaus, in the order of Monarch's getting-started guide.

Run it with ``python examples/getting_started.py``. Each section prints what it
shows and checks it, so the tour doubles as a test
(``tests/integration/test_getting_started.py`` runs it).
A Monarch program runs with ``monarch`` in its imports replaced by ``danaus``.

Sections: actors and endpoints; futures; proc meshes and host meshes; context
and ranks; supervision with ``MeshFailure``; RDMA buffers; channels and
ports; ``send``; threads and actors; distributed tensors, passed to actors
and made by them with ``rref`` (when torch is installed:
``pip install 'danaus[torch]'``).
"""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any

from danaus.actor import (
    Actor,
    ActorError,
    Channel,
    MeshFailure,
    Port,
    ProcMesh,
    context,
    current_rank,
    current_size,
    endpoint,
    send,
    this_host,
    this_proc,
)
from danaus.rdma import RDMABuffer

TIMEOUT = 60.0


# -- 1. Actors and endpoints ------------------------------------------------------------


class Counter(Actor):
    """State lives in the actor; endpoints are the only way in, one message at a time."""

    def __init__(self, start: int) -> None:
        self.value = start

    @endpoint
    def incr(self, by: int = 1) -> None:
        self.value += by

    @endpoint
    def get(self) -> int:
        return self.value

    @endpoint
    def divide(self, by: int) -> float:
        return self.value / by


def actors_and_endpoints() -> None:
    # An actor in this very process: no new OS process, same verbs.
    local = this_proc().spawn("local_counter", Counter, 10)
    local.incr.call_one(5).get(timeout=TIMEOUT)
    assert local.get.call_one().get(timeout=TIMEOUT) == 15
    print("1. a local actor counted to", local.get.call_one().get(timeout=TIMEOUT))
    local.stop().get(timeout=TIMEOUT)


# -- 2. Futures ---------------------------------------------------------------------------


def futures(counters: Any) -> None:
    fut = counters.slice(gpus=0).get.call_one()  # returns at once
    value = fut.get(timeout=TIMEOUT)  # blocks this thread

    async def from_asyncio() -> int:
        return await counters.slice(gpus=1).get.call_one()  # suspends a task instead

    assert asyncio.run(from_asyncio()) == value == 0
    try:
        counters.slice(gpus=0).divide.call_one(0).get(timeout=TIMEOUT)
    except ActorError as e:  # the remote exception, with its remote traceback
        assert isinstance(e.exception, ZeroDivisionError)
        print("2. a remote ZeroDivisionError came back as ActorError; the actor lives on")
    assert counters.slice(gpus=0).get.call_one().get(timeout=TIMEOUT) == 0


# -- 3. Proc meshes and host meshes ----------------------------------------------------------


def meshes(procs: ProcMesh, counters: Any) -> None:
    host = this_host()  # the 0-dimensional mesh of this machine
    assert host.sizes == {}
    assert procs.sizes == {"gpus": 4}
    counters.incr.broadcast()  # fire and forget, to every actor
    counters.slice(gpus=slice(0, 2)).incr.broadcast(10)  # to a slice
    values = counters.get.call().get(timeout=TIMEOUT)  # a ValueMesh, one value per actor
    assert list(values.values()) == [11, 11, 1, 1]
    print("3. after a broadcast and a sliced broadcast:", values.values())


# -- 4. Context and ranks -------------------------------------------------------------------


class Trainer(Actor):
    @endpoint
    def where(self) -> dict[str, Any]:
        me = context().actor_instance
        return {
            "rank": dict(me.rank),  # my place in the whole mesh
            "message_rank": dict(current_rank()),  # my place in the slice messaged
            "size": current_size(),
            "pid": os.getpid(),
        }


def context_and_ranks(procs: ProcMesh) -> None:
    trainers = procs.spawn("trainers", Trainer)
    row = trainers.slice(gpus=slice(2, 4)).where.call().get(timeout=TIMEOUT)
    infos = list(row.values())
    assert [i["rank"] for i in infos] == [{"gpus": 2}, {"gpus": 3}]
    assert [i["message_rank"] for i in infos] == [{"gpus": 0}, {"gpus": 1}]
    assert len({i["pid"] for i in infos}) == 2  # one OS process per proc
    print("4. a slice's actors know both ranks:", [(i["rank"], i["message_rank"]) for i in infos])
    trainers.stop().get(timeout=TIMEOUT)


# -- 5. Supervision with MeshFailure ----------------------------------------------------------


class Fragile(Actor):
    @endpoint
    def crash(self) -> None:
        raise RuntimeError("boom")  # with no one to reply to (broadcast), the actor fails


class Supervisor(Actor):
    """Owns a mesh; its ``__supervise__`` hears about every failure there."""

    def __init__(self, report: Port[str]) -> None:
        self.report = report
        self.children: Any = None

    @endpoint
    def start(self) -> None:
        self.children = this_proc().spawn("fragile", Fragile)
        self.children.initialized.get(timeout=TIMEOUT)
        self.children.crash.broadcast()

    def __supervise__(self, failure: MeshFailure) -> bool:
        # Runs on this actor's thread, between messages.
        self.report.send(failure.mesh_name)
        return True  # handled: the failure stops here


def supervision(procs: ProcMesh) -> None:
    report, reports = Channel.open()
    supervisor = procs.slice(gpus=0).spawn("supervisor", Supervisor, report)
    supervisor.start.call_one().get(timeout=TIMEOUT)
    failed = reports.recv().get(timeout=TIMEOUT)
    assert failed == "fragile"
    print("5. the owner handled the failure of mesh", failed)
    supervisor.stop().get(timeout=TIMEOUT)


# -- 6. RDMA buffers ----------------------------------------------------------------------------


class Weights(Actor):
    def __init__(self) -> None:
        self.data = bytearray(b"w" * 1024)
        self.buffer = RDMABuffer(memoryview(self.data))

    @endpoint
    def handle(self) -> RDMABuffer:
        return self.buffer  # a small handle; the bytes stay where they are

    @endpoint
    def first(self) -> bytes:
        return bytes(self.data[:4])


def rdma(procs: ProcMesh) -> None:
    weights = procs.slice(gpus=3).spawn("weights", Weights)
    buffer = weights.handle.call_one().get(timeout=TIMEOUT)
    local = bytearray(buffer.size())
    buffer.read_into(memoryview(local)).get(timeout=TIMEOUT)  # one-sided: no actor code runs
    assert bytes(local) == b"w" * 1024
    buffer.write_from(memoryview(bytearray(b"new!" * 256))).get(timeout=TIMEOUT)
    assert weights.first.call_one().get(timeout=TIMEOUT) == b"new!"
    print("6. read and wrote 1 KiB of another process's memory through an RDMABuffer")
    weights.stop().get(timeout=TIMEOUT)


# -- 7. Channels and ports; 8. send ---------------------------------------------------------------


class Producer(Actor):
    @endpoint
    def produce(self, port: Port[int], n: int) -> None:
        for i in range(n):
            port.send(i * i)  # arrives in order: one sender, one port


def channels_and_send(procs: ProcMesh, counters: Any) -> None:
    port, receiver = Channel.open()
    producers = procs.slice(gpus=1).spawn("producer", Producer)
    producers.produce.call_one(port, 3).get(timeout=TIMEOUT)
    got = [receiver.recv().get(timeout=TIMEOUT) for _ in range(3)]
    assert got == [0, 1, 4]
    print("7. a port passed to an actor brought back", got)

    # send: the low-level verb under every adverb; each actor's reply goes to the port.
    port, receiver = Channel.open()
    send(counters.get, (), {}, port=port)
    replies = sorted(receiver.recv().get(timeout=TIMEOUT) for _ in range(4))
    assert replies == [1, 1, 11, 11]
    print("8. send() to the whole mesh; replies on our port:", replies)
    producers.stop().get(timeout=TIMEOUT)


# -- 9. Threads and actors ------------------------------------------------------------------------


def threads_and_actors(counters: Any) -> None:
    # Any thread may call actors; each actor still handles one message at a time.
    def work() -> None:
        for _ in range(25):
            counters.incr.call().get(timeout=TIMEOUT)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    values = list(counters.get.call().get(timeout=TIMEOUT).values())
    assert values == [111, 111, 101, 101]  # 100 increments each, none lost
    print("9. 4 threads x 25 calls: every increment arrived:", values)


# -- 10. Distributed tensors ---------------------------------------------------------------------


class Scaler(Actor):
    """Section 10: ``rref`` turns what an endpoint returns into a distributed tensor."""

    @endpoint(propagate=lambda x: x)  # the result's shape, from the argument's (meta tensors)
    def scale(self, x: Any) -> Any:
        return x * 2


def distributed_tensors(procs: ProcMesh) -> None:
    try:
        import torch
    except ImportError:
        print("10. distributed tensors: skipped, torch is not installed")
        return
    from danaus import fetch_shard

    # Under activate(), torch code on the client runs on every proc, each on its shard.
    with procs.activate():
        t = torch.ones(2, 3) + procs.rank("gpus")  # shard k holds 1 + k
        total = t.reduce("gpus", "sum")  # an all-reduce over the gpus dimension
        shard2 = fetch_shard(t, gpus=2).get(timeout=TIMEOUT)
        summed = fetch_shard(total, gpus=0).get(timeout=TIMEOUT)
    assert torch.equal(shard2, torch.full((2, 3), 3.0))
    assert torch.equal(summed, torch.full((2, 3), 10.0))  # (1+0) + (1+1) + (1+2) + (1+3)
    # An actor on each proc gets its proc's shard; with rref, what it returns becomes a
    # distributed tensor at once (propagate gives the shape), usable in further ops.
    scalers = procs.spawn("scalers", Scaler)
    out = torch.relu(scalers.scale.rref(t) - 5)  # no active mesh needed: t's mesh
    shard3 = fetch_shard(out, gpus=3).get(timeout=TIMEOUT)
    assert torch.equal(shard3, torch.full((2, 3), 3.0))  # relu(2 * (1 + 3) - 5)
    scalers.stop().get(timeout=TIMEOUT)
    print(
        "10. shard 2 holds 3s; reduced over gpus every shard holds",
        summed[0, 0].item(),
        "; rref: shard 3 of relu(2t - 5) holds",
        shard3[0, 0].item(),
    )


def main() -> None:
    actors_and_endpoints()
    procs = this_host().spawn_procs(per_host={"gpus": 4})
    counters = procs.spawn("counters", Counter, 0)
    futures(counters)
    meshes(procs, counters)
    context_and_ranks(procs)
    supervision(procs)
    rdma(procs)
    channels_and_send(procs, counters)
    threads_and_actors(counters)
    distributed_tensors(procs)
    procs.stop().get(timeout=TIMEOUT)
    print("tour complete")


if __name__ == "__main__":
    main()
