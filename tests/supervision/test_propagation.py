"""Failures go to the owner of the mesh, and climb the ownership tree (issue 5).

Every mesh is owned by the actor that spawned it. The owner's
``__supervise__(failure)`` decides: truthy handles it; falsy or raising fails
the owner, whose own owner hears next. An actor that only holds a reference to
a mesh is never told. Stopping an actor stops the meshes it owns first.
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path
from typing import Any

import pytest

from danaus.actor import (
    Actor,
    ActorMesh,
    Channel,
    Port,
    ProcMesh,
    SupervisionError,
    endpoint,
    this_host,
)

from .conftest import TIMEOUT, pid_alive, settle, wait_pids_gone
from .test_actor_failures import Victim


class Supervisor(Actor):
    """Owns a mesh of ``Victim`` workers on procs it spawns; reports supervision on a port.

    ``verdict`` is what ``__supervise__`` does: ``"handle"`` (return True),
    ``"decline"`` (return False) or ``"raise"``.
    """

    def __init__(self, report: Port[Any], verdict: str) -> None:
        self.report = report
        self.verdict = verdict
        self.children: Any = None

    @endpoint
    def start_workers(self, n: int) -> list[int]:
        self.procs = this_host().spawn_procs(per_host={"gpus": n})
        self.children = self.procs.spawn("workers", Victim)
        self.children.initialized.get(timeout=TIMEOUT)
        return list(self.children.pid.call().get(timeout=TIMEOUT).values())

    @endpoint
    def start_supervisor(self, name: str, verdict: str) -> list[int]:
        """Own a child supervisor (on a proc of our own) that owns two workers."""
        self.procs = this_host().spawn_procs(per_host={"gpus": 1})
        self.children = self.procs.spawn(name, Supervisor, self.report, verdict)
        pids = self.children.start_workers.call_one(2).get(timeout=TIMEOUT)
        return [*pids, self.children.pid.call_one().get(timeout=TIMEOUT)]

    @endpoint
    def fail_worker(self, rank: int) -> None:
        self.children.slice(gpus=rank).raise_value_error.broadcast()

    @endpoint
    def fail_grandchild(self, rank: int) -> None:
        self.children.fail_worker.call_one(rank).get(timeout=TIMEOUT)

    @endpoint
    def ping(self) -> str:
        return "alive"

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    def __supervise__(self, failure: Any) -> bool:
        me = type(self).__name__
        self.report.send(
            (
                me,
                failure.mesh_name,
                failure.crashed_ranks,
                failure.reason,
                failure.mesh_name == self.children.name,
            )
        )
        if self.verdict == "handle":
            return True
        if self.verdict == "raise":
            raise RuntimeError("the supervisor gave up")
        return False


class Holder(Actor):
    """Holds a reference to a mesh it did not spawn."""

    def __init__(self) -> None:
        self.mesh: Any = None
        self.supervised: list[str] = []

    @endpoint
    def hold(self, mesh: ActorMesh[Any]) -> None:
        self.mesh = mesh

    @endpoint
    def call_held(self, x: int) -> Any:
        try:
            return self.mesh.ping.call_one(x).get(timeout=TIMEOUT)
        except SupervisionError as e:
            return f"SupervisionError: {e}"

    @endpoint
    def supervised_failures(self) -> list[str]:
        return self.supervised

    def __supervise__(self, failure: Any) -> bool:
        self.supervised.append(str(failure))
        return True


def spawn_supervisor(pm: ProcMesh, verdict: str, name: str = "supervisor") -> tuple[Any, Any]:
    port, receiver = Channel.open()
    sup = pm.spawn(name, Supervisor, port, verdict)
    sup.initialized.get(timeout=TIMEOUT)
    return sup, receiver


def test_supervise_returning_true_handles_the_failure_and_the_client_hears_nothing(
    spawn_procs, faults
) -> None:
    pm = spawn_procs(gpus=1)
    sup, reports = spawn_supervisor(pm, "handle")
    sup.start_workers.call_one(2).get(timeout=TIMEOUT)
    sup.fail_worker.call_one(1).get(timeout=TIMEOUT)
    who, mesh_name, ranks, reason, is_own_mesh = reports.recv().get(timeout=TIMEOUT)
    assert (who, mesh_name, ranks, is_own_mesh) == ("Supervisor", "workers", [1], True)
    assert "bad value 42" in reason
    assert sup.ping.call_one().get(timeout=TIMEOUT) == "alive"  # orders any report before
    assert settle(faults, pm) == []


@pytest.mark.parametrize(
    ("verdict", "why"),
    [("decline", "declined"), ("raise", "the supervisor gave up")],
)
def test_supervise_declining_or_raising_fails_the_owner_and_its_owner_hears(
    spawn_procs, faults, verdict: str, why: str
) -> None:
    pm = spawn_procs(gpus=1)
    sup, reports = spawn_supervisor(pm, verdict)
    worker_pids = sup.start_workers.call_one(2).get(timeout=TIMEOUT)
    sup.fail_worker.call_one(0).get(timeout=TIMEOUT)
    assert reports.recv().get(timeout=TIMEOUT)[:3] == ("Supervisor", "workers", [0])
    (failure,) = faults.wait(1)
    assert failure.mesh_name == "supervisor"
    assert failure.crashed_ranks == [0]
    assert why in failure.reason
    assert "workers" in failure.reason  # the original failure is named
    # As Monarch's, the report names the actor the failure started at, under its owner
    first = failure.report().splitlines()[0]
    assert re.fullmatch(
        r"The actor <root>\.<\S+\.Supervisor supervisor\{'gpus': 0/1\}>\.<\S+\.Victim workers"
        r"\{'gpus': 0/2\}> and all its descendants have failed:",
        first,
    ), first
    with pytest.raises(SupervisionError):
        sup.ping.call_one().get(timeout=TIMEOUT)
    # The failed supervisor's meshes are stopped: nobody is left to supervise them.
    assert wait_pids_gone(worker_pids) == []


def test_a_declined_failure_climbs_until_an_owner_handles_it(spawn_procs, faults) -> None:
    pm = spawn_procs(gpus=1)
    top, reports = spawn_supervisor(pm, "handle", name="top")
    top.start_supervisor.call_one("middle", "decline").get(timeout=TIMEOUT)
    top.fail_grandchild.call_one(1).get(timeout=TIMEOUT)
    # Two reports from two procs: no order between them.
    seen = {r[1]: r for r in (reports.recv().get(timeout=TIMEOUT) for _ in range(2))}
    assert seen["workers"][2] == [1]  # the middle supervisor saw its worker fail
    assert seen["middle"][2] == [0]  # then the top one saw the middle one fail
    assert "declined" in seen["middle"][3]
    assert top.ping.call_one().get(timeout=TIMEOUT) == "alive"
    assert settle(faults, pm) == []


def test_only_the_owner_hears_of_a_failure_not_a_holder_of_a_reference(spawn_procs, faults) -> None:
    pm = spawn_procs(gpus=2)
    victims = pm.spawn("victims", Victim)
    holder = pm.slice(gpus=0).spawn("holder", Holder)
    holder.hold.call_one(victims.slice(gpus=1)).get(timeout=TIMEOUT)
    victims.slice(gpus=1).raise_value_error.broadcast()
    (failure,) = faults.wait(1)
    assert (failure.mesh_name, failure.crashed_ranks) == ("victims", [1])
    # The holder is a caller: calling the failed actor raises SupervisionError ...
    assert holder.call_held.call_one(1).get(timeout=TIMEOUT).startswith("SupervisionError")
    # ... but it was never asked to supervise, and it lives on.
    assert holder.supervised_failures.call_one().get(timeout=TIMEOUT) == []
    assert settle(faults, pm) == []


def test_the_owner_gets_exactly_one_failure_per_failed_rank(spawn_procs, faults) -> None:
    pm = spawn_procs(gpus=2)
    victims = pm.spawn("victims", Victim)
    witness = pm.spawn("witness", Victim)  # on the same procs: its failures mark progress
    pids = victims.pid.call().get(timeout=TIMEOUT).values()
    witness.initialized.get(timeout=TIMEOUT)
    victims.slice(gpus=1).raise_value_error.broadcast()
    faults.wait(1)
    # Rank 1 fails a second way: its proc dies. Then rank 0's proc dies too.
    os.kill(pids[1], signal.SIGKILL)
    os.kill(pids[0], signal.SIGKILL)
    events = faults.wait_until(
        lambda events: (
            {("witness", 0), ("witness", 1)} <= {(e.mesh_name, e.crashed_ranks[0]) for e in events}
        ),
        "the failures of both witnesses",
    )
    events += settle(faults, spawn_procs(gpus=1))  # anything the losses still produced
    assert sorted((e.mesh_name, e.crashed_ranks) for e in events) == [
        ("victims", [0]),
        ("victims", [1]),
        ("witness", [0]),
        ("witness", [1]),
    ]


class Recorder(Actor):
    """Appends ``<name> cleanup`` to a file when stopped; may own children."""

    def __init__(self, path: str, label: str) -> None:
        self.path = path
        self.label = label
        self.children: Any = None

    @endpoint
    def spawn_children(self, on: ProcMesh | None = None) -> None:
        if on is None:
            self.procs = this_host().spawn_procs(per_host={"gpus": 2})
            on = self.procs
        self.children = on.spawn("children", Recorder, self.path, "child")
        self.children.initialized.get(timeout=TIMEOUT)

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    def __cleanup__(self, exc: BaseException | None) -> None:
        with open(self.path, "a") as f:
            f.write(f"{self.label} cleanup\n")


def test_stopping_an_actor_stops_the_meshes_it_owns_first(spawn_procs, tmp_path: Path) -> None:
    pm = spawn_procs(gpus=1)
    log = tmp_path / "cleanups.txt"
    parent = pm.spawn("parent", Recorder, str(log), "parent")
    parent.spawn_children.call_one().get(timeout=TIMEOUT)
    parent.stop().get(timeout=TIMEOUT)
    assert log.read_text().splitlines() == ["child cleanup", "child cleanup", "parent cleanup"]


def test_stopping_an_actor_stops_what_it_spawned_on_procs_it_does_not_own(
    spawn_procs, tmp_path: Path
) -> None:
    pm = spawn_procs(gpus=2)
    log = tmp_path / "cleanups.txt"
    parent = pm.slice(gpus=0).spawn("parent", Recorder, str(log), "parent")
    parent.spawn_children.call_one(pm).get(timeout=TIMEOUT)
    bystander = pm.spawn("bystander", Victim)
    parent.stop().get(timeout=TIMEOUT)
    assert log.read_text().splitlines() == ["child cleanup", "child cleanup", "parent cleanup"]
    # The procs were the client's: they and the other actors on them live on.
    assert list(bystander.ping.call(4).get(timeout=TIMEOUT).values()) == [4, 4]
    assert all(pid_alive(p) for p in bystander.pid.call().get(timeout=TIMEOUT).values())


def test_stopping_an_async_actor_that_owns_meshes_is_quiet_and_stops_them(client_script) -> None:
    result = client_script.run(
        """
import os
from danaus.actor import Actor, endpoint, this_host

class Child(Actor):
    @endpoint
    async def pid(self) -> int:
        return os.getpid()

class AsyncParent(Actor):
    @endpoint
    async def start(self) -> list[int]:
        self.procs = this_host().spawn_procs(per_host={"gpus": 2})
        self.children = self.procs.spawn("children", Child)
        return list((await self.children.pid.call()).values())

procs = this_host().spawn_procs(per_host={"gpus": 1})
parent = procs.spawn("parent", AsyncParent)
print("CHILD PIDS", *parent.start.call_one().get(timeout=30), flush=True)
parent.stop().get(timeout=30)
print("STOPPED", flush=True)
procs.stop().get(timeout=30)
"""
    )
    assert result.returncode == 0, result.stderr
    line = next(ln for ln in result.stdout.splitlines() if ln.startswith("CHILD PIDS"))
    assert wait_pids_gone(int(p) for p in line.split()[2:]) == []
    assert "Warning" not in result.stderr, result.stderr
