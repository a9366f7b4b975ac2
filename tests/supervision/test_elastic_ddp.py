"""``examples/elastic_ddp.py`` trains to the end when one of its replicas is SIGKILLed mid-run.

Both runs are real processes: the undisturbed run gives the final loss the
killed run must reach (within 5%), with every step done once, in order, no
step redone (``lost_steps=0``), one replacement joined, and equal replicas.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field

import pytest

from danaus.elastic import ElasticMesh, ElasticReplica, Membership

from .conftest import REPO, client_env, wait_pids_gone

EXAMPLE = REPO / "examples" / "elastic_ddp.py"
STEPS = 60
KILL_AFTER = 10  # SIGKILL a replica once this step's line is out
# Each run is bounded: generous, since starting five replicas that import torch on a
# busy two-core machine takes most of a minute.
RUN_TIMEOUT = 300.0

STEP = re.compile(r"^STEP (\d+) world=(\d+) loss=([0-9.]+)$")
DONE = re.compile(r"^DONE steps=(\d+) restarts=(\d+) lost_steps=(\d+) recovery_s=([0-9.]+)$")


@dataclass
class Run:
    pids: list[int] = field(default_factory=list)
    steps: list[tuple[int, int, float]] = field(default_factory=list)
    equal: str = ""
    done: dict[str, float] = field(default_factory=dict)
    killed: int | None = None
    output: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return "\n".join(self.output[-60:])


def run_example(tmp_path, kill: bool) -> Run:
    proc = subprocess.Popen(
        [sys.executable, "-u", str(EXAMPLE), "--steps", str(STEPS)],
        cwd=tmp_path,
        env=client_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    run = Run()
    try:
        while (line := lines.get(timeout=RUN_TIMEOUT)) is not None:
            run.output.append(line)
            if line.startswith("PIDS "):
                run.pids = [int(p) for p in line.split()[1:]]
            elif m := STEP.match(line):
                run.steps.append((int(m[1]), int(m[2]), float(m[3])))
                if kill and run.killed is None and int(m[1]) == KILL_AFTER:
                    run.killed = run.pids[1]
                    os.kill(run.killed, signal.SIGKILL)
            elif line.startswith("REPLICAS_EQUAL "):
                run.equal = line.split()[1]
            elif m := DONE.match(line):
                run.done = {
                    "steps": int(m[1]),
                    "restarts": int(m[2]),
                    "lost_steps": int(m[3]),
                    "recovery_s": float(m[4]),
                }
        assert proc.wait(timeout=RUN_TIMEOUT) == 0, run
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(RUN_TIMEOUT)
        assert proc.stdout is not None
        proc.stdout.close()
    return run


@pytest.fixture(scope="module")
def undisturbed(tmp_path_factory) -> Run:
    return run_example(tmp_path_factory.mktemp("undisturbed"), kill=False)


def check_complete(run: Run) -> None:
    assert len(run.pids) == 4, run
    assert [k for k, _, _ in run.steps] == list(range(STEPS)), run  # each step once, in order
    assert run.equal == "True", run
    assert run.output[-1].startswith("DONE "), run
    assert run.done["steps"] == STEPS and run.done["lost_steps"] == 0, run


@pytest.mark.timeout(2 * RUN_TIMEOUT)
def test_undisturbed_run_trains_at_full_size(undisturbed: Run) -> None:
    check_complete(undisturbed)
    assert {w for _, w, _ in undisturbed.steps} == {4}, undisturbed
    assert undisturbed.done["restarts"] == 0, undisturbed
    assert undisturbed.steps[-1][2] < undisturbed.steps[0][2], undisturbed  # it learns


@pytest.mark.timeout(3 * RUN_TIMEOUT)
def test_a_replica_killed_mid_run_costs_no_step(tmp_path, undisturbed: Run) -> None:
    run = run_example(tmp_path, kill=True)
    assert run.killed is not None
    wait_pids_gone([run.killed])
    check_complete(run)
    assert run.done["restarts"] == 1, run  # the spare took the lost replica's place
    assert run.steps[-1][1] == 4, run  # back at full size
    final, reference = run.steps[-1][2], undisturbed.steps[-1][2]
    assert abs(final - reference) <= 0.05 * reference, (final, reference)
    # The lost share of each batch went to the others: the same losses as undisturbed,
    # step by step (to rounding: gloo sums three partial sums instead of four).
    for (k, _, loss), (_, _, ref) in zip(run.steps, undisturbed.steps, strict=True):
        assert loss == pytest.approx(ref, rel=1e-4), (k, loss, ref)


class _NotAReplica:
    pass


class _Replica(ElasticReplica):
    pass


@pytest.mark.parametrize(
    ("cls", "kwargs", "error", "match"),
    [
        (_NotAReplica, {"replicas": 2}, TypeError, "ElasticReplica subclass"),
        (_Replica, {"replicas": 0}, ValueError, "replicas must be an int >= 1"),
        (_Replica, {"replicas": 2, "spares": -1}, ValueError, "spares must be an int >= 0"),
        (_Replica, {"replicas": 2, "timeout": 0}, ValueError, "timeout must be a positive"),
    ],
)
def test_elastic_mesh_refuses_bad_arguments_before_spawning(cls, kwargs, error, match) -> None:
    with pytest.raises(error, match=match):
        ElasticMesh(cls, **kwargs)


@pytest.mark.parametrize("world", [1, 3, 4])
def test_the_members_shards_cover_the_batch_once(world: int) -> None:
    shards = [list(Membership(0, r, world, r).shard(10)) for r in range(world)]
    assert sorted(i for s in shards for i in s) == list(range(10))
