"""Monarch's ``Instance.kill`` and ``Instance.set_system`` on real procs (issue 28 §3)."""

from __future__ import annotations

import threading

import pytest

from danaus.actor import Actor, MeshFailure, SupervisionError, context, endpoint

from .conftest import TIMEOUT, FaultRecorder


class Killable(Actor):
    @endpoint
    def kill_self(self, reason: str | None) -> str:
        context().actor_instance.kill(reason)
        return "kill() returned"  # unlike abort(), kill() does not unwind the endpoint

    @endpoint
    def kill_from_a_thread(self) -> None:
        instance = context().actor_instance
        t = threading.Thread(target=instance.kill, args=("from a helper thread",))
        t.start()
        t.join()

    @endpoint
    def ping(self) -> str:
        return "pong"

    @endpoint
    def mark_system(self) -> bool:
        context().actor_instance.set_system()
        return context().actor_instance.is_system


def test_kill_fails_the_actor_with_its_reason_after_the_endpoint_returns(
    spawn_procs, faults: FaultRecorder
) -> None:
    mesh = spawn_procs(gpus=1).spawn("killable", Killable)
    assert mesh.kill_self.call_one("enough").get(timeout=TIMEOUT) == "kill() returned"
    (failure,) = faults.wait(1)
    assert isinstance(failure, MeshFailure)
    assert "was killed: enough" in failure.reason
    with pytest.raises(SupervisionError):
        mesh.ping.call_one().get(timeout=TIMEOUT)


def test_kill_works_from_another_thread_and_without_a_reason_says_so(
    spawn_procs, faults: FaultRecorder
) -> None:
    mesh = spawn_procs(gpus=1).spawn("killable", Killable)
    mesh.kill_from_a_thread.call_one().get(timeout=TIMEOUT)
    (failure,) = faults.wait(1)
    assert "from a helper thread" in failure.reason

    other = spawn_procs(gpus=1).spawn("killable2", Killable)
    other.kill_self.call_one(None).get(timeout=TIMEOUT)
    failure = faults.wait(2)[1]
    assert "kill() was called" in failure.reason


def test_kill_on_the_client_root_is_refused() -> None:
    with pytest.raises(RuntimeError, match="only be called by an actor"):
        context().actor_instance.kill("no")


def test_set_system_is_reported_by_stats(spawn_procs) -> None:
    procs = spawn_procs(gpus=1)
    system = procs.spawn("infra", Killable)
    user = procs.spawn("user", Killable)
    assert system.mark_system.call_one().get(timeout=TIMEOUT) is True
    user.ping.call_one().get(timeout=TIMEOUT)
    (proc,) = procs.stats().get(timeout=TIMEOUT).procs
    assert proc.snapshot is not None
    flags = {a["name"]: a["is_system"] for a in proc.snapshot["actors"]}
    assert flags == {"infra": True, "user": False}


class Spawner(Actor):
    @endpoint
    def children(self) -> list[str]:
        """Spawn actors on this proc, then list ``_children`` before, during and after."""
        inst = context().actor_instance
        before = inst._children
        here = inst.proc.spawn("child_pings", Killable)
        during = [type(c).__name__ for c in inst._children or []]
        here.stop().get(timeout=TIMEOUT)
        return [repr(before), *during, repr(inst._children)]


def test_children_lists_the_meshes_an_instance_spawned_until_they_stop(spawn_procs) -> None:
    client = context().actor_instance
    before = {id(c) for c in client._children or []}
    procs = spawn_procs(gpus=1)
    actors = procs.spawn("child_actor", Killable)
    new = [c for c in client._children or [] if id(c) not in before]
    assert procs in new and actors in new
    client._children = [c for c in client._children or [] if id(c) in before] or None
    with pytest.raises(ValueError, match="not meshes"):
        client._children = [object()]
    procs.stop().get(timeout=TIMEOUT)
    assert not [c for c in client._children or [] if id(c) not in before]
    # an actor's own children
    inside = spawn_procs(gpus=1).spawn("spawner", Spawner)
    assert inside.children.call_one().get(timeout=TIMEOUT) == ["None", "ActorMesh", "None"]
