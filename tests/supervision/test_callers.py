"""What callers of a mesh see once some of its actors have failed (issue 5).

Calls to a failed actor raise ``SupervisionError`` (a ``RuntimeError``) that
names it, at once and without hanging; the healthy part of the mesh, and other
meshes on the same procs, keep answering; stopping still works when procs are
dead; and spawning anew after a failure works.
"""

from __future__ import annotations

import os
import signal

import pytest

from danaus.actor import SupervisionError, this_host

from .conftest import TIMEOUT, wait_pids_gone
from .test_actor_failures import Victim, spawn_victims


def test_healthy_ranks_keep_answering_after_one_rank_failed(spawn_procs, faults) -> None:
    pm = spawn_procs(hosts=2, gpus=2)
    mesh = pm.spawn("victims", Victim)
    mesh.slice(hosts=1, gpus=0).raise_value_error.broadcast()
    faults.wait(1)
    healthy = [mesh.slice(hosts=0), mesh.slice(hosts=1, gpus=1)]
    assert list(healthy[0].ping.call(1).get(timeout=TIMEOUT).values()) == [1, 1]
    assert healthy[1].ping.call_one(2).get(timeout=TIMEOUT) == 2
    assert healthy[0].ping.choose(3).get(timeout=TIMEOUT) == 3
    assert sorted(f.get(timeout=TIMEOUT) for f in healthy[0].ping.stream(4)) == [4, 4]


@pytest.mark.parametrize("how", ["exception", "killed"])
def test_a_call_to_a_failed_rank_raises_supervision_error_naming_it(
    spawn_procs, faults, how: str
) -> None:
    victims = spawn_victims(spawn_procs)
    if how == "exception":
        victims.slice(gpus=1).raise_value_error.broadcast()
        why = "bad value 42"
    else:
        os.kill(victims.slice(gpus=1).pid.call_one().get(timeout=TIMEOUT), signal.SIGKILL)
        why = "SIGKILL"
    faults.wait(1)
    for target in (victims.slice(gpus=1), victims):
        with pytest.raises(SupervisionError) as info:
            target.ping.call(1).get(timeout=TIMEOUT)
        err = info.value
        assert isinstance(err, RuntimeError)
        assert why in str(err)  # why it failed
        assert "victims[1]" in str(err), str(err)  # which actor


def test_a_call_in_flight_when_the_proc_dies_names_the_actor_and_rank(spawn_procs, faults) -> None:
    victims = spawn_victims(spawn_procs)
    with pytest.raises(SupervisionError) as info:
        victims.slice(gpus=1).kill_own_process.call_one().get(timeout=TIMEOUT)
    faults.wait(1)
    assert "victims[1]" in str(info.value), str(info.value)


def test_a_call_to_the_whole_mesh_fails_fast_once_a_rank_failed(spawn_procs, faults) -> None:
    victims = spawn_victims(spawn_procs)
    pid = victims.slice(gpus=0).pid.call_one().get(timeout=TIMEOUT)
    os.kill(pid, signal.SIGKILL)
    faults.wait(1)
    with pytest.raises(SupervisionError):
        victims.ping.call(1).get(timeout=TIMEOUT)
    with pytest.raises(SupervisionError):
        victims.ping.broadcast(1)
    # Futures of a stream: the failed rank's fails, the healthy one's answers.
    outcomes = []
    for f in victims.ping.stream(5):
        try:
            outcomes.append(f.get(timeout=TIMEOUT))
        except SupervisionError:
            outcomes.append("failed")
    assert sorted(outcomes, key=str) == [5, "failed"]


def test_new_slices_that_contain_a_failed_rank_fail_fast(spawn_procs, faults) -> None:
    pm = spawn_procs(hosts=2, gpus=2)
    mesh = pm.spawn("victims", Victim)
    mesh.slice(hosts=0, gpus=1).raise_value_error.broadcast()
    faults.wait(1)
    for view in (mesh.slice(gpus=1), mesh.slice(hosts=0), mesh.flatten("all").slice(all=1)):
        with pytest.raises(SupervisionError, match=r"victims\[1\]"):
            view.ping.call(1).get(timeout=TIMEOUT)
    assert mesh.slice(hosts=1, gpus=1).ping.call_one(6).get(timeout=TIMEOUT) == 6


def test_other_meshes_on_the_procs_of_a_failed_actor_still_work(spawn_procs, faults) -> None:
    pm = spawn_procs(gpus=2)
    first = pm.spawn("first", Victim)
    second = pm.spawn("second", Victim)
    first.slice(gpus=1).raise_value_error.broadcast()
    faults.wait(1)
    assert list(second.ping.call(8).get(timeout=TIMEOUT).values()) == [8, 8]
    third = pm.spawn("third", Victim)
    assert list(third.ping.call(9).get(timeout=TIMEOUT).values()) == [9, 9]


def test_stop_succeeds_on_meshes_whose_procs_are_dead(faults) -> None:
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    mesh = pm.spawn("victims", Victim)
    pids = list(mesh.pid.call().get(timeout=TIMEOUT).values())
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    faults.wait(2)
    mesh.stop().get(timeout=TIMEOUT)
    pm.stop().get(timeout=TIMEOUT)
    assert wait_pids_gone(pids) == []
    with pytest.raises(SupervisionError):
        mesh.ping.call(1).get(timeout=TIMEOUT)


def test_stop_succeeds_on_a_mesh_with_one_dead_proc_and_stops_the_others(faults) -> None:
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    mesh = pm.spawn("victims", Victim)
    pids = list(mesh.pid.call().get(timeout=TIMEOUT).values())
    os.kill(pids[0], signal.SIGKILL)
    faults.wait(1)
    pm.stop().get(timeout=TIMEOUT)
    assert wait_pids_gone(pids) == []


def test_respawning_procs_and_actors_after_a_failure_works(spawn_procs, faults) -> None:
    victims = spawn_victims(spawn_procs)
    victims.slice(gpus=1).kill_own_process.broadcast()
    faults.wait(1)
    fresh_procs = spawn_procs(gpus=2)
    fresh = fresh_procs.spawn("victims", Victim)  # the same name is fine
    assert list(fresh.ping.call(10).get(timeout=TIMEOUT).values()) == [10, 10]
    # Replace just the failed rank: one new proc, one new actor.
    replacement = spawn_procs(gpus=1).spawn("replacement", Victim)
    assert replacement.ping.call_one(11).get(timeout=TIMEOUT) == 11
    assert victims.slice(gpus=0).ping.call_one(12).get(timeout=TIMEOUT) == 12
