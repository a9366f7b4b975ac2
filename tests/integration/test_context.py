"""context() inside actors on procs: the running actor instance, the message rank, and the
current_* helpers. In the client outside any actor: ``tests/unit/actor/test_context.py``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from danaus.actor import (
    Actor,
    HostMesh,
    Point,
    ProcMesh,
    context,
    current_actor_name,
    current_rank,
    current_size,
    endpoint,
    this_host,
    this_proc,
)

from .conftest import REPLY_TIMEOUT


class Introspect(Actor):
    def __init__(self) -> None:
        self.init_rank = context().actor_instance.rank
        self.init_name = context().actor_instance.name
        self.init_actor_name = current_actor_name()

    @endpoint
    def describe(self) -> dict[str, Any]:
        ctx = context()
        inst = ctx.actor_instance
        return {
            "rank": inst.rank,
            "message_rank": ctx.message_rank,
            "current_rank": current_rank(),
            "current_size": current_size(),
            "name": inst.name,
            "current_actor_name": current_actor_name(),
            "actor_id": inst.actor_id,
            "creator": str(inst.creator),
            "creator_name": inst.creator.name if inst.creator is not None else None,
            "str": str(inst),
            "class_name": inst.class_name,
            "pid": os.getpid(),
            "proc_id": inst.proc_id,
        }

    @endpoint
    def init_view(self) -> tuple[Point, str, str]:
        return self.init_rank, self.init_name, self.init_actor_name

    @endpoint
    def proc_pid_via_context(self) -> tuple[int, int, bool, bool]:
        proc = context().actor_instance.proc
        child = proc.spawn("ctx_child", Child)
        child_pid, creator_name = child.whoami.call_one().get(timeout=REPLY_TIMEOUT)
        assert creator_name == context().actor_instance.name
        return (
            os.getpid(),
            child_pid,
            isinstance(proc, ProcMesh) and len(proc) == 1,
            isinstance(this_host(), HostMesh) and isinstance(this_proc(), ProcMesh),
        )


class Child(Actor):
    @endpoint
    def whoami(self) -> tuple[int, str | None]:
        creator = context().actor_instance.creator
        return os.getpid(), creator.name if creator is not None else None


@pytest.fixture(scope="module")
def grid() -> Iterator[ProcMesh]:
    pm = this_host().spawn_procs(per_host={"replicas": 2, "gpus": 2}, name="grid")
    yield pm
    pm.stop().get(timeout=REPLY_TIMEOUT)


@pytest.fixture(scope="module")
def introspect(grid: ProcMesh) -> Any:
    return grid.spawn("introspect", Introspect)


def test_actor_instance_rank_is_its_point_in_the_full_mesh(introspect) -> None:
    values = introspect.describe.call().get(timeout=REPLY_TIMEOUT)
    for point, info in values.items():
        rank = info["rank"]
        assert isinstance(rank, Point)
        assert dict(rank.extent) == {"replicas": 2, "gpus": 2}
        assert dict(rank) == dict(point)
        assert info["message_rank"] == rank
        assert info["current_rank"] == rank
        assert info["current_size"] == {"replicas": 2, "gpus": 2}
    assert [v["rank"].rank for v in values.values()] == [0, 1, 2, 3]


def test_message_rank_is_the_position_in_the_slice_messaged(introspect) -> None:
    values = introspect.slice(gpus=1).describe.call().get(timeout=REPLY_TIMEOUT)
    assert values.sizes == {"replicas": 2}
    for replica, info in enumerate(values.values()):
        assert dict(info["rank"]) == {"replicas": replica, "gpus": 1}
        assert info["rank"].rank == replica * 2 + 1
        assert dict(info["message_rank"]) == {"replicas": replica}
        assert info["message_rank"].rank == replica
        assert info["current_rank"] == info["message_rank"]
        assert info["current_size"] == {"replicas": 2}


def test_message_rank_of_a_single_actor_slice_is_zero_dimensional(introspect) -> None:
    info = introspect.slice(replicas=1, gpus=0).describe.call_one().get(timeout=REPLY_TIMEOUT)
    assert dict(info["rank"]) == {"replicas": 1, "gpus": 0}
    assert dict(info["message_rank"]) == {}
    assert info["current_size"] == {}


def test_message_rank_of_a_strided_slice(introspect) -> None:
    values = introspect.slice(replicas=slice(1, 2), gpus=slice(0, 2)).describe.call()
    infos = list(values.get(timeout=REPLY_TIMEOUT).values())
    assert [i["rank"].rank for i in infos] == [2, 3]
    assert [dict(i["message_rank"]) for i in infos] == [
        {"replicas": 0, "gpus": 0},
        {"replicas": 0, "gpus": 1},
    ]


def test_choose_delivers_the_chosen_actors_own_position_as_message_rank(introspect) -> None:
    seen = set()
    for _ in range(32):
        info = introspect.describe.choose().get(timeout=REPLY_TIMEOUT)
        assert info["message_rank"] == info["rank"]
        seen.add(info["rank"].rank)
    assert len(seen) > 1


def test_instance_names_id_and_creator(introspect) -> None:
    values = introspect.describe.call().get(timeout=REPLY_TIMEOUT)
    infos = list(values.values())
    assert {i["name"] for i in infos} == {"introspect"}
    assert [i["current_actor_name"] for i in infos] == [str(i["actor_id"]) for i in infos]
    assert len({i["current_actor_name"] for i in infos}) == 4  # unique per actor, as in Monarch
    assert {i["class_name"] for i in infos} == {"Introspect"}
    assert len({i["actor_id"] for i in infos}) == 4
    assert len({i["pid"] for i in infos}) == 4
    assert len({i["proc_id"] for i in infos}) == 4
    for info in infos:
        # Monarch's forms: the proc as a "proc@location" string; the id's string members
        actor_id = info["actor_id"]
        assert isinstance(info["proc_id"], str)
        assert info["proc_id"] == f"{actor_id.proc.name}@{actor_id.proc.addr}" == actor_id.proc_id
        assert actor_id.proc_name == actor_id.proc.name
        assert actor_id.actor_name == actor_id.mesh and actor_id.mesh.startswith("introspect")
        assert actor_id.addr == actor_id.proc.addr and actor_id.addr.startswith("unix:")
        assert info["creator"] == "<root>"
        assert info["creator_name"] == "root"
        assert info["str"].startswith("<root>.")
        assert "introspect" in info["str"]


def test_context_in_init_already_knows_rank_and_name(introspect) -> None:
    values = introspect.init_view.call().get(timeout=REPLY_TIMEOUT)
    for point, (rank, name, actor_name) in values.items():
        assert dict(rank) == dict(point)
        assert name == "introspect"
        assert actor_name.endswith(f"[{rank.rank}]")


def test_instance_proc_is_a_one_proc_mesh_spawning_in_the_actors_process(introspect) -> None:
    actor_pid, child_pid, proc_ok, facades_ok = (
        introspect.slice(replicas=0, gpus=1)
        .proc_pid_via_context.call_one()
        .get(timeout=REPLY_TIMEOUT)
    )
    assert child_pid == actor_pid
    assert proc_ok
    assert facades_ok
