"""Chaos: procs of a mesh are SIGKILLed at random while the client keeps calling (issue 5).

For a bounded time every call must either return its correct value or raise
``SupervisionError`` (or ``ActorError``); none may hang or return a wrong
value. Afterwards the ranks that were not killed still answer, and the owner
got exactly one failure for each killed rank.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time

from danaus.actor import Actor, ActorError, SupervisionError, current_rank, endpoint

from .conftest import TIMEOUT

CHAOS_SECONDS = 3.0
RANKS = 4
KILLS = 3  # at least one rank survives


class Squarer(Actor):
    @endpoint
    def square(self, x: int) -> tuple[int, int]:
        return current_rank().rank, x * x

    @endpoint
    def pid(self) -> int:
        return os.getpid()


def test_random_proc_kills_never_hang_or_corrupt_calls(spawn_procs, faults) -> None:
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    pm = spawn_procs(gpus=RANKS)
    mesh = pm.spawn("squarers", Squarer)
    pids = list(mesh.pid.call().get(timeout=TIMEOUT).values())
    doomed = rng.sample(range(RANKS), KILLS)
    kill_at = sorted(rng.uniform(0.2, CHAOS_SECONDS - 0.5) for _ in doomed)
    killed: list[int] = []
    stop = threading.Event()

    def killer() -> None:
        start = time.monotonic()
        for rank, at in zip(doomed, kill_at, strict=True):
            # Pacing the chaos, not synchronising: wake at the planned moment.
            if stop.wait(max(0.0, start + at - time.monotonic())):
                return
            os.kill(pids[rank], signal.SIGKILL)
            killed.append(rank)

    thread = threading.Thread(target=killer, name="chaos-killer")
    thread.start()
    outcomes = {"ok": 0, "failed": 0}
    deadline = time.monotonic() + CHAOS_SECONDS
    try:
        while time.monotonic() < deadline:
            x = rng.randrange(1000)
            if rng.random() < 0.25:
                try:
                    values = mesh.square.call(x).get(timeout=TIMEOUT)
                except (SupervisionError, ActorError):
                    outcomes["failed"] += 1
                else:
                    assert list(values.values()) == [(r, x * x) for r in range(RANKS)], seed
                    outcomes["ok"] += 1
                continue
            rank = rng.randrange(RANKS)
            try:
                got = mesh.slice(gpus=rank).square.call_one(x).get(timeout=TIMEOUT)
            except (SupervisionError, ActorError):
                outcomes["failed"] += 1
            else:
                assert got == (0, x * x), (seed, rank, x, got)  # rank within the slice
                outcomes["ok"] += 1
    finally:
        stop.set()
        thread.join(TIMEOUT)
    assert sorted(killed) == sorted(doomed), seed
    assert outcomes["ok"] > 0 and outcomes["failed"] > 0, (seed, outcomes)

    events = faults.wait(KILLS)
    assert sorted(r for e in events for r in e.crashed_ranks) == sorted(doomed), seed
    for rank in set(range(RANKS)) - set(doomed):
        assert mesh.slice(gpus=rank).square.call_one(3).get(timeout=TIMEOUT) == (0, 9)
