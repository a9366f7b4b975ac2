"""``danaus.worker.worker.DeviceMesh``: a worker's view of its device mesh (Monarch's
``monarch.worker.worker.DeviceMesh``, issue 42)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")

from danaus import NDSlice
from danaus.worker.worker import DeviceMesh, Dim


def test_each_dimension_lists_the_ranks_through_the_worker() -> None:
    procs = NDSlice(offset=0, sizes=[3, 4, 2], strides=[8, 2, 1])
    m = DeviceMesh(5, ("a", "b", "c"), procs, rank=13)  # coordinates (1, 2, 1)
    assert m.dims["a"] == Dim("a", 1, 3, [5, 13, 21])
    assert m.dims["b"] == Dim("b", 2, 4, [9, 11, 13, 15])
    assert m.dims["c"] == Dim("c", 1, 2, [12, 13])
    assert m.all_ranks == list(range(24))
    assert m.get_ranks_for_dim_slice(()) == []
    assert m.get_ranks_for_dim_slice(("a", "c")) == [4, 5, 12, 13, 20, 21]
    assert m.get_ranks_for_dim_slice(("c", "a")) == [4, 12, 20, 5, 13, 21]
    assert m.get_ranks_for_dim_slice(("a", "b", "c")) == list(range(24))
    with pytest.raises(KeyError, match="'z'"):
        m.get_ranks_for_dim_slice(("z",))


def test_an_offset_strided_mesh_and_a_rank_outside_it() -> None:
    procs = NDSlice(offset=100, sizes=[2, 2], strides=[10, 1])  # ranks 100 101 110 111
    m = DeviceMesh(0, ("x", "y"), procs, rank=110)
    assert m.dims["x"].members == [100, 110] and m.dims["y"].members == [110, 111]
    with pytest.raises(ValueError, match="rank 5"):
        DeviceMesh(0, ("x", "y"), procs, rank=5)
    with pytest.raises(ValueError, match="names"):
        DeviceMesh(0, ("x",), procs, rank=100)


def test_process_groups_are_made_once_per_stream_and_dims() -> None:
    made: list[tuple[str, list[int]]] = []

    def factory(name: str, ranks: list[int]) -> Any:
        made.append((name, ranks))
        return object()

    procs = NDSlice(offset=0, sizes=[2, 3], strides=[3, 1])
    m = DeviceMesh(7, ("dp", "tp"), procs, rank=4, group_factory=factory)
    pg = m.create_process_group("main", ["tp"])
    assert made == [("mesh_7_stream_main_1_X", [3, 4, 5])]
    assert m.get_process_group("main", ("tp",)) is pg
    with pytest.raises(ValueError, match="already exists"):
        m.create_process_group("main", ("tp",))
    other = m.create_process_group("side", ("tp",))  # another stream: its own group
    assert other is not pg
    both = m.create_process_group("main", ("tp", "dp"), pg=3)
    assert made[-1] == ("mesh_7_stream_main_X_X_group_3", [0, 1, 2, 3, 4, 5])
    assert m.get_process_group("main", ("dp", "tp"), pg=3) is both
    with pytest.raises(KeyError, match="create_process_group first"):
        m.get_process_group("main", ("dp",))


def test_the_default_group_is_a_torch_distributed_group() -> None:
    import torch.distributed as dist

    procs = NDSlice(offset=0, sizes=[1, 1], strides=[1, 1])
    m = DeviceMesh(0, ("a", "b"), procs, rank=0)
    if dist.is_initialized():  # pragma: no cover - another test left a world behind
        pytest.fail("torch.distributed is already initialised in this process")
    with pytest.raises(RuntimeError, match="not initialized"):
        m.create_process_group("main", ("a",))
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        pg = m.create_process_group("main", ("a",))
        assert dist.get_process_group_ranks(pg) == [0] and pg.size() == 1
    finally:
        dist.destroy_process_group()
