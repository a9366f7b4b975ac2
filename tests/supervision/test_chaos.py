"""Chaos: procs of a mesh are SIGKILLed at random while the client keeps calling (issue 5).

For a bounded time every call must either return its correct value or raise
``SupervisionError`` (or ``ActorError``); none may hang or return a wrong
value. Afterwards the ranks that were not killed still answer, and the owner
got exactly one failure for each killed rank.

The second test does the same with backpressure engaged (issue 12): tiny
water marks, and every call and reply carrying 256 KiB, so inboxes pause
their connections at every message and senders are held back; nothing may
be lost or altered, and a sender held back by a killed proc gives up.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from typing import Any

import numpy as np

import danaus.config
from danaus._runtime.node import this_node
from danaus.actor import Actor, ActorError, SupervisionError, current_rank, endpoint, this_host

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

    @endpoint
    def padded(self, x: int, pad: Any) -> tuple[int, int, Any]:
        assert (pad == x % 256).all()  # what was sent arrived unaltered
        return current_rank().rank, x * x, pad

    @endpoint
    def pauses(self) -> int:
        rt = this_node(start=False).runtime
        assert rt is not None
        return rt.pauses


PAD = 256 << 10
MARKS = {
    "send_high_water": 64 << 10,
    "send_low_water": 16 << 10,
    "inbox_high_water": 64 << 10,
    "inbox_low_water": 16 << 10,
}


def _small_marks() -> None:
    danaus.config.configure(**MARKS)


def test_random_proc_kills_never_hang_or_corrupt_calls(spawn_procs, faults) -> None:
    _chaos(spawn_procs(gpus=RANKS), faults, padded=False)


def test_random_proc_kills_with_backpressure_engaged_lose_nothing(faults) -> None:
    pm = this_host().spawn_procs(per_host={"gpus": RANKS}, bootstrap=_small_marks)
    try:
        assert pm.initialized.get(timeout=TIMEOUT) is True
        with danaus.config.configured(**MARKS):
            _chaos(pm, faults, padded=True)
    finally:
        pm.stop().get(timeout=TIMEOUT)


def _chaos(pm: Any, faults: Any, *, padded: bool) -> None:
    seed = random.randrange(2**32)
    rng = random.Random(seed)
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
    if padded:
        pauses_before = sum(mesh.pauses.call().get(timeout=TIMEOUT).values())
    deadline = time.monotonic() + CHAOS_SECONDS
    try:
        while time.monotonic() < deadline:
            if padded:
                _padded_round(mesh, rng, seed, outcomes)
                continue
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
    if padded:  # backpressure was engaged: the survivors' inboxes paused their connections
        survivors = [r for r in range(RANKS) if r not in doomed]
        pauses = sum(mesh.slice(gpus=r).pauses.call_one().get(timeout=TIMEOUT) for r in survivors)
        assert pauses > pauses_before, (seed, pauses, pauses_before)


def _padded_round(mesh: Any, rng: random.Random, seed: int, outcomes: dict[str, int]) -> None:
    """Eight calls in flight at once, each carrying (and answered with) 256 KiB."""
    calls = []
    for _ in range(8):
        x, rank = rng.randrange(1000), rng.randrange(RANKS)
        pad = np.full(PAD, x % 256, dtype=np.uint8)
        calls.append((x, mesh.slice(gpus=rank).padded.call_one(x, pad)))
    for x, fut in calls:
        try:
            rank, sq, pad = fut.get(timeout=TIMEOUT)
        except (SupervisionError, ActorError):
            outcomes["failed"] += 1
        else:
            assert (rank, sq) == (0, x * x), (seed, x, rank, sq)
            assert pad.nbytes == PAD and (pad == x % 256).all(), seed
            outcomes["ok"] += 1
