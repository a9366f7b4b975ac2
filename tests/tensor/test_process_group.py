"""``mesh.process_group(dims)``: torch.distributed groups inside remote functions."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

import danaus
from danaus.actor import ProcMesh

from . import helpers
from .conftest import COORDS, REPLY_TIMEOUT, base, local_base, torch

pytestmark = pytest.mark.torch

all_reduce_in = danaus.remote(helpers.all_reduce_in)
all_gather_in = danaus.remote(helpers.all_gather_in)
group_facts = danaus.remote(helpers.group_facts)
broadcast_from = danaus.remote(helpers.broadcast_from)


def _members(dims: tuple[str, ...], h: int, g: int) -> list[tuple[int, int]]:
    """The coordinates in (h, g)'s group, row-major: those agreeing outside ``dims``."""
    return [(a, b) for a, b in COORDS if ("host" in dims or a == h) and ("gpu" in dims or b == g)]


@pytest.mark.parametrize("dims", [("gpu",), ("host",), ("host", "gpu")])
def test_all_reduce_over_a_process_group_equals_reduce(mesh: ProcMesh, dims: Any) -> None:
    pg = mesh.process_group(dims[0] if len(dims) == 1 else dims)
    assert isinstance(pg, danaus.RemoteProcessGroup)
    assert pg.size() == 2 ** len(dims)
    with mesh.activate():
        x = base(mesh)
        mine = all_reduce_in(x, pg)
        theirs = x.reduce(dims, "sum")
    for h, g in COORDS:
        expect = sum(local_base(a, b) for a, b in _members(dims, h, g))
        assert torch.equal(danaus.inspect(mine, host=h, gpu=g), expect), (h, g)
        assert torch.equal(danaus.inspect(theirs, host=h, gpu=g), expect), (h, g)


def test_group_ranks_follow_the_mesh_and_global_ranks_are_the_procs(mesh: ProcMesh) -> None:
    pg = mesh.process_group("host")
    with mesh.activate():
        facts = group_facts.call(pg).get(timeout=REPLY_TIMEOUT)
        gathered = all_gather_in(base(mesh), pg)
        from_host1 = broadcast_from(base(mesh), pg, group_src=1)
    for point, f in facts.items():
        h, g = point["host"], point["gpu"]
        assert f == {
            "is_process_group": True,
            "rank": h,
            "size": 2,
            "global_ranks": [g, 2 + g],
        }
    for h, g in COORDS:
        expect = torch.stack([local_base(0, g), local_base(1, g)])
        assert torch.equal(danaus.inspect(gathered, host=h, gpu=g), expect)
        assert torch.equal(danaus.inspect(from_host1, host=h, gpu=g), local_base(1, g))


def test_a_process_group_of_a_slice_spans_the_slices_procs(mesh: ProcMesh) -> None:
    row = mesh.slice(host=1)
    pg = row.process_group("gpu")
    with row.activate():
        x = torch.arange(3.0) + row.rank("gpu")
        mine = all_reduce_in(x, pg)
        theirs = x.reduce("gpu", "sum")
        from_global_3 = broadcast_from(x, pg, src=3)  # the global rank of (host=1, gpu=1)
        facts = group_facts.call(pg).get(timeout=REPLY_TIMEOUT)
    for g in range(2):
        assert torch.equal(danaus.inspect(mine, gpu=g), torch.arange(3.0) * 2 + 1)
        assert torch.equal(danaus.inspect(theirs, gpu=g), torch.arange(3.0) * 2 + 1)
        assert torch.equal(danaus.inspect(from_global_3, gpu=g), torch.arange(3.0) + 1)
    assert [f["global_ranks"] for f in facts.values()] == [[2, 3], [2, 3]]
    assert [f["rank"] for f in facts.values()] == [0, 1]


def test_propagate_gets_a_dummy_group_whose_collectives_do_nothing(mesh: ProcMesh) -> None:
    seen: list[Any] = []

    def propagate(x: Any, pg: Any) -> Any:
        seen.append((type(pg).__name__, pg.size(), pg.rank(), pg.dims))
        y = x.clone()
        torch.distributed.all_reduce(y, group=pg)
        return y

    summed = danaus.remote(helpers.all_reduce_in, propagate=propagate)
    known = dict(torch.distributed.distributed_c10d._world.pg_group_ranks)
    with mesh.activate():
        out = summed(base(mesh), mesh.process_group("gpu"))
    assert seen == [("DummyProcessGroup", 2, 0, ("gpu",))]
    # the dummy's ranks were told to torch for propagate only
    assert torch.distributed.distributed_c10d._world.pg_group_ranks == known
    assert torch.equal(danaus.inspect(out, host=1, gpu=0), local_base(1, 0) + local_base(1, 1))

    from danaus._tensor.groups import DummyProcessGroup

    dummy = DummyProcessGroup(("gpu",), 2)
    t = torch.ones(3)
    torch.distributed.all_reduce(t, group=dummy)
    out_list = [torch.zeros(3), torch.zeros(3)]
    torch.distributed.all_gather(out_list, t, group=dummy)
    torch.distributed.barrier(group=dummy)
    assert torch.equal(t, torch.ones(3))  # unchanged: nothing was reduced
    assert all(torch.equal(o, torch.zeros(3)) for o in out_list)
    assert torch.distributed.get_world_size(dummy) == 2


def test_call_on_shard_and_fetch_takes_a_group_of_one_proc_only(mesh: ProcMesh) -> None:
    with mesh.activate():
        one = danaus.call_on_shard_and_fetch(
            group_facts, mesh.process_group(()), shard={"host": 1, "gpu": 1}
        ).get(timeout=REPLY_TIMEOUT)
        with pytest.raises(ValueError, match=r"spans 2 procs but only one proc runs"):
            danaus.call_on_shard_and_fetch(group_facts, mesh.process_group("gpu"))
    assert one == {"is_process_group": True, "rank": 0, "size": 1, "global_ranks": [3]}


@pytest.mark.parametrize(
    ("dims", "error", "match"),
    [
        ("rack", ValueError, r"'rack' not found in .*\['host', 'gpu'\]"),
        (("gpu", "rack"), ValueError, r"'rack' not found in .*\['host', 'gpu'\]"),
        (("gpu", "gpu"), ValueError, r"'gpu' is named twice in \['gpu', 'gpu'\]"),
        (3, TypeError, "a dimension name or a sequence of names, got 3"),
        (("gpu", 0), TypeError, "named by a string, got 0"),
    ],
)
def test_process_group_rejects_bad_dims(
    mesh: ProcMesh, dims: Any, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        mesh.process_group(dims)


def test_a_process_group_cannot_be_used_on_the_client(mesh: ProcMesh) -> None:
    pg = mesh.process_group("gpu")
    with pytest.raises(AttributeError, match="exists only on the workers"):
        torch.distributed.all_reduce(torch.ones(2), group=pg)  # type: ignore[arg-type]
    with pytest.raises(AttributeError, match=r"has no attribute 'rank'.*danaus\.remote"):
        pg.rank()
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(pg)
    assert not hasattr(pg, "allreduce")


def test_a_group_of_another_mesh_or_a_dropped_group_is_refused(mesh: ProcMesh) -> None:
    row_pg = mesh.slice(host=0).process_group("gpu")
    pg = mesh.process_group("gpu")
    pg.drop()
    assert pg.dropped
    with mesh.activate():
        x = base(mesh)
        with pytest.raises(ValueError, match="make the process group from the active mesh"):
            all_reduce_in(x, row_pg)
        with pytest.raises(ValueError, match="was dropped"):
            all_reduce_in(x, pg)
