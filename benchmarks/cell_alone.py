#!/usr/bin/env python3
"""What the actor cell itself costs per call: the cell alone, in one process.

    python benchmarks/cell_alone.py [--calls 50000]

A sync actor's inbox is filled with ``--calls`` calls before the actor may take
any (its ``__init__`` waits), then the actor's thread takes, decodes, runs,
measures and answers them; the figure is that thread's CPU time per call
(``time.thread_time`` from its first reply to its last), so other load on the
machine barely moves it. The runtime is a stub whose ``reply`` only counts: no
sockets, no I/O thread, no pickling of replies. Not part of ``run.py``; a
diagnostic for the actor side of the hot path (issue 39: ``ActorCell`` as
parts), to compare two versions of ``src`` run the same way.
"""

from __future__ import annotations

import argparse
import pickle
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from danaus import _config as config
from danaus._actor.core.cell import ActorCell
from danaus._actor.core.endpoints import EndpointProperty
from danaus._runtime.messaging.metrics import Recent
from danaus._wire import codec
from danaus._wire.ids import ActorId, PortId, ProcId
from danaus._wire.protocol import Call, Kind, Message, Spawn

GATE = threading.Event()  # set once the calls are queued


class Echo:
    def __init__(self) -> None:
        GATE.wait()  # the calls are queued before the actor takes any

    @EndpointProperty
    def echo(self, x: object) -> object:
        return x


class Stub:
    """The runtime as the cell sees it; ``reply`` counts the answers to port 5."""

    proc_id = ProcId("p", "unix:/nowhere/p")

    def __init__(self, calls: int) -> None:
        self.metrics = True
        self.recent = Recent(config.get("query_ring_size"), config.get("query_messages_per_s"))
        self.tracer = None
        self.calls = calls
        self.n = 0
        self.first = self.last = 0.0
        self.done = threading.Event()

    def reply(self, port: Any, slot: int, status: int, value: Any) -> int:
        if port is None or port.port != 5:
            return 0
        self.n += 1
        if self.n == 1:
            self.first = time.thread_time()
        elif self.n == self.calls:
            self.last = time.thread_time()
            self.done.set()
        return 10

    def pause_delivering(self, gate: Any) -> None:
        return None

    def resume_reading(self, conns: Any, gate: Any) -> None:
        pass

    def begin_wait(self) -> None:
        pass

    def end_wait(self) -> None:
        pass

    def flush_held(self) -> None:
        pass

    def reader_for(self, proc: Any) -> None:
        return None

    def close_port(self, no: int) -> None:
        pass

    def send(self, *args: Any, **kwargs: Any) -> None:
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=50_000)
    n = ap.parse_args().calls
    rt = Stub(n)
    client = ProcId("c", "unix:/nowhere/c")
    spawn = Spawn("echo.1", 0, PortId(client, 1), 0, ("gpus",), (1,), None, "sync")
    # By reference (plain pickle): cloudpickle would take __main__'s class by value.
    body = pickle.dumps((Echo, (), {}, "echo", None), protocol=5)
    cell = ActorCell(
        rt,  # type: ignore[arg-type]
        "echo.1",
        0,
        Message(Kind.SPAWN, spawn, memoryview(body), []),
        lambda c: None,
    )
    args = memoryview(codec.dumps(((7,), {}))[0])
    sender = ActorId(client, "client", 0)
    header = Call("echo.1", 0, "echo", PortId(client, 5), 0, ("gpus",), (1,), sender, (), 0)
    for _ in range(n):
        cell.deliver(Message(Kind.CALL, header, args, []), client)
    GATE.set()
    if not rt.done.wait(300):
        raise SystemExit(f"the actor answered {rt.n} of {n} calls in 300 s")
    print(f"actor thread CPU per call: {1e6 * (rt.last - rt.first) / (n - 1):.3f} us")


if __name__ == "__main__":
    main()
