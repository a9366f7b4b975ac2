"""Fault-tolerant training: a supervisor respawns a worker whose process was killed mid-step.

Run it with ``python examples/fault_tolerant_training.py``; it takes a few seconds.

::

    client ──train_step(step)──▶ Supervisor (its own proc)
                                   │ owns, on procs it spawned itself:
                                   ├─ worker rank 0 ┐
                                   ├─ worker rank 1 ├─ partial_sum(step, rank, world)
                                   ├─ ...           ┘
                                   └─ __supervise__: a worker failed → record it, spawn a
                                      new proc and worker for that rank; train_step retries

Each step, every worker sums a deterministic function over its shard of the
data and the supervisor adds the partial sums. Mid-way, while a step is in
flight, the client SIGKILLs the process of one worker. The supervisor's
``__supervise__`` (it owns the workers, so the failure comes to it, not to the
client) records the failure and respawns that rank; the interrupted step is
retried and training finishes with the same result as a run without failures.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from typing import Any

from danaus.actor import (
    Actor,
    Channel,
    Port,
    SupervisionError,
    concurrent_endpoint,
    endpoint,
    this_host,
)

WORLD = 4  # workers
STEPS = 8
ITEMS = 1000  # data items, sharded across the workers
KILL_STEP = 3  # during this step ...
KILL_RANK = 2  # ... the process of this worker is killed
TIMEOUT = 30.0


def loss(step: int, item: int) -> int:
    """The (deterministic) contribution of one data item at one step."""
    return (step * 31 + item * 17) % 101


def expected_total() -> int:
    return sum(loss(s, i) for s in range(STEPS) for i in range(ITEMS))


class Worker(Actor):
    """Computes a partial sum over its shard; lives in a process of its own."""

    @endpoint
    def partial_sum(self, step: int, rank: int, world: int, mid_step: Port[int] | None) -> int:
        total = sum(loss(step, i) for i in range(rank, ITEMS, world))
        if mid_step is not None:
            # Tell the client we are in the middle of this step, then keep working on it
            # (long enough for the client to kill this process).
            mid_step.send(os.getpid())
            threading.Event().wait(TIMEOUT)
        return total


class Supervisor(Actor):
    """Owns the workers, adds up their partial sums, and respawns any that fail."""

    def __init__(self, mid_step: Port[int]) -> None:
        self.mid_step = mid_step
        self.ranks: list[Any] = []  # one single-actor mesh per rank
        self.rank_of: dict[str, list[int]] = {}  # mesh name -> global rank of each of its actors
        self.failures: list[str] = []
        self.generation = 0  # bumped after each recovery
        self.recovered: asyncio.Condition | None = None

    @endpoint
    async def start(self) -> None:
        self.recovered = asyncio.Condition()
        procs = this_host().spawn_procs(per_host={"gpus": WORLD})
        workers = procs.spawn("workers", Worker)
        await workers.initialized
        self.ranks = [workers.slice(gpus=r) for r in range(WORLD)]
        self.rank_of["workers"] = list(range(WORLD))

    # Concurrent, so that __supervise__ can run while a step waits on the workers.
    @concurrent_endpoint
    async def train_step(self, step: int, pause_rank: int | None = None) -> int:
        assert self.recovered is not None
        attempt = 0
        while True:
            generation = self.generation
            calls = [
                mesh.partial_sum.call_one(
                    step, r, WORLD, self.mid_step if (r == pause_rank and attempt == 0) else None
                )
                for r, mesh in enumerate(self.ranks)
            ]
            try:
                return sum(await asyncio.gather(*(asyncio.wait_for(c, TIMEOUT) for c in calls)))
            except SupervisionError:
                attempt += 1
                async with self.recovered:  # wait for __supervise__ to replace the worker
                    await asyncio.wait_for(
                        self.recovered.wait_for(lambda g=generation: self.generation > g), TIMEOUT
                    )

    @endpoint
    async def failure_log(self) -> list[str]:
        return self.failures

    async def __supervise__(self, failure: Any) -> bool:
        assert self.recovered is not None
        for crashed in failure.crashed_ranks:
            rank = self.rank_of[failure.mesh_name][crashed]
            self.failures.append(f"rank {rank}: {failure.reason}")
            name = f"worker{rank}-gen{self.generation + 1}"
            replacement = this_host().spawn_procs(per_host={"gpus": 1}).spawn(name, Worker)
            await replacement.initialized
            self.ranks[rank] = replacement
            self.rank_of[name] = [rank]
        async with self.recovered:
            self.generation += 1
            self.recovered.notify_all()
        return True  # handled: the client never hears of it


def main() -> None:
    mid_step, mid_step_receiver = Channel[int].open()
    supervisor_procs = this_host().spawn_procs(per_host={"procs": 1})
    supervisor = supervisor_procs.spawn("supervisor", Supervisor, mid_step)
    supervisor.start.call_one().get(timeout=TIMEOUT)

    total = 0
    for step in range(STEPS):
        pause = KILL_RANK if step == KILL_STEP else None
        result = supervisor.train_step.call_one(step, pause)
        if pause is not None:
            pid = mid_step_receiver.recv().get(timeout=TIMEOUT)
            print(f"step {step}: killing worker rank {KILL_RANK} (pid {pid}) mid-step")
            os.kill(pid, signal.SIGKILL)
        partial = result.get(timeout=TIMEOUT)
        total += partial
        print(f"step {step}: {partial}")

    for line in supervisor.failure_log.call_one().get(timeout=TIMEOUT):
        print(f"recovered from a failure of {line}")
    supervisor_procs.stop().get(timeout=TIMEOUT)
    assert total == expected_total(), (total, expected_total())
    print(f"final result: {total}")


if __name__ == "__main__":
    main()
