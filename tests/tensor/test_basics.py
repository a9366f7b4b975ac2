"""Torch ops under an active mesh: factories, ops, methods, views, fetching, freeing, misuse."""

from __future__ import annotations

import gc
from typing import Any

import pytest

import danaus
from danaus.actor import ProcMesh

from .conftest import COORDS, base, local_base, torch

pytestmark = pytest.mark.torch


def test_each_shard_holds_its_own_value_computed_from_its_rank(mesh: ProcMesh) -> None:
    with mesh.activate():
        x = base(mesh)
        y = (x * 2 - 1).reshape(2, 3)
        z = y @ y.T
    for h, g in COORDS:
        ly = (local_base(h, g) * 2 - 1).reshape(2, 3)
        assert torch.equal(danaus.inspect(x, host=h, gpu=g), local_base(h, g))
        assert torch.equal(danaus.inspect(z, host=h, gpu=g), ly @ ly.T)


def test_a_mesh_device_goes_to_factories_without_one_under_the_mesh_only(mesh: ProcMesh) -> None:
    """The rule that puts shards on the GPU of a CUDA mesh, checked on CPU with the meta
    device standing in for the GPU (the GPU machine runs the real thing)."""
    from torch.utils._python_dispatch import _disable_current_modes

    from danaus._tensor.active import _DefaultDevice

    with mesh.activate(), _DefaultDevice(torch.device("meta")):
        given = torch.zeros(2)  # no device: the mesh's
        kept = torch.zeros(2, device="cpu")  # an explicit one is kept
        params = torch.nn.Linear(2, 2).weight  # a module's parameters, made by factories
        with _disable_current_modes():  # local torch (what ``propagate`` runs under)
            local = torch.zeros(2)
    assert isinstance(given, danaus.Tensor) and given.device.type == "meta"
    assert kept.device.type == "cpu" and params.device.type == "meta"
    assert not isinstance(local, danaus.Tensor) and local.device.type == "cpu"


def test_factories_methods_and_dtypes_match_local_torch(mesh: ProcMesh) -> None:
    with mesh.activate():
        a = torch.ones(3, 4, dtype=torch.float64)
        b = torch.full((4,), 2.5).double()
        c = torch.linspace(0, 1, 5)
        d = torch.tensor([[1, 2], [3, 4]])
        e = (a * b).sum(dim=1)
        f = torch.cat([c, c]).view(2, 5).T.contiguous()
        assert isinstance(e, danaus.Tensor)
        assert e.shape == (3,) and e.dtype == torch.float64
        got = danaus.inspect({"e": e, "f": f, "d": d.sum(), "m": d.max(dim=0)}, host=1, gpu=0)
    lc = torch.linspace(0, 1, 5)
    assert torch.equal(got["e"], (torch.ones(3, 4, dtype=torch.float64) * 2.5).sum(dim=1))
    assert torch.equal(got["f"], torch.cat([lc, lc]).view(2, 5).T.contiguous())
    assert int(got["d"]) == 10
    assert torch.equal(got["m"].values, torch.tensor([3, 4]))
    assert torch.equal(got["m"].indices, torch.tensor([1, 1]))


def test_in_place_ops_and_writes_through_views_change_the_base(mesh: ProcMesh) -> None:
    with mesh.activate():
        x = base(mesh).reshape(2, 3)
        row = x[1]
        row.add_(100)
        x.mul_(2)
        x[0, 0] = -1.0
    for h, g in COORDS:
        expect = local_base(h, g).reshape(2, 3)
        expect[1].add_(100)
        expect.mul_(2)
        expect[0, 0] = -1.0
        assert torch.equal(danaus.inspect(x, host=h, gpu=g), expect)
        assert torch.equal(danaus.inspect(row, host=h, gpu=g), expect[1])


def test_rank_of_several_dims_and_ranks_give_each_shard_its_coordinates(mesh: ProcMesh) -> None:
    with mesh.activate():
        flat = mesh.rank(["host", "gpu"])
        ranks = mesh.ranks
        gpu = mesh.rank_tensor("gpu")  # Monarch's names for the same
        monarch_ranks = mesh.rank_tensors()
    for h, g in COORDS:
        assert int(danaus.inspect(flat, host=h, gpu=g)) == 2 * h + g
        got = danaus.inspect(ranks, host=h, gpu=g)
        assert (int(got["host"]), int(got["gpu"])) == (h, g)
        assert int(danaus.inspect(gpu, host=h, gpu=g)) == g
        got = danaus.inspect(monarch_ranks, host=h, gpu=g)
        assert (int(got["host"]), int(got["gpu"])) == (h, g)


def test_fetch_shard_returns_a_future_and_defaults_to_coordinate_zero(mesh: ProcMesh) -> None:
    with mesh.activate():
        x = base(mesh)
        fut = danaus.fetch_shard((x, 7, "s"), {"host": 1})
        first = danaus.fetch_shard(x).result(timeout=30)
    value, seven, s = fut.result(timeout=30)
    assert torch.equal(value, local_base(1, 0)) and (seven, s) == (7, "s")
    assert torch.equal(first, local_base(0, 0))


def test_show_prints_the_shard(mesh: ProcMesh, capsys: pytest.CaptureFixture[str]) -> None:
    with mesh.activate():
        danaus.show(torch.arange(3) + 5, gpu=1)
    assert "tensor([5, 6, 7])" in capsys.readouterr().out


def test_no_mesh_and_get_active_mesh(mesh: ProcMesh) -> None:
    with pytest.raises(ValueError, match="no device mesh is active"):
        danaus.get_active_mesh()
    with mesh.activate():
        assert danaus.get_active_mesh() is mesh
        with danaus.no_mesh.activate():
            local = torch.arange(3) * 2
            assert type(local) is torch.Tensor
            with pytest.raises(ValueError, match="no device mesh is active"):
                danaus.get_active_mesh()
        assert isinstance(torch.zeros(2), danaus.Tensor)
    act = mesh.activate()
    assert danaus.get_active_mesh() is mesh
    mesh.deactivate()
    with pytest.raises(ValueError):
        danaus.get_active_mesh()
    assert act is not None


def test_a_local_tensor_under_the_mesh_is_an_error_that_says_what_to_do(mesh: ProcMesh) -> None:
    local = torch.ones(3)
    with mesh.activate():
        x = torch.ones(3)
        with pytest.raises(ValueError, match="no_mesh") as info:
            x + local
    assert "local (non-distributed) tensor" in str(info.value)
    assert "to_mesh" in str(info.value)


def test_a_tensor_of_another_mesh_is_an_error(mesh: ProcMesh) -> None:
    other = mesh.slice(host=0)
    with mesh.activate():
        x = torch.ones(3)
    with other.activate():
        y = torch.ones(3)
        with pytest.raises(ValueError, match="was used while mesh"):
            x + y


def test_an_op_on_mesh_tensors_with_no_active_mesh_runs_on_their_mesh(mesh: ProcMesh) -> None:
    # As Monarch (its getting-started runs torch.relu on an rref result outside activate()).
    with mesh.activate():
        x = base(mesh)
    y = torch.relu(x - 3)  # no mesh is active
    assert isinstance(y, danaus.Tensor)
    with mesh.activate():
        both = y + x  # refused (ValueError) were y on another mesh than x's
    for h, g in COORDS:
        assert torch.equal(danaus.inspect(y, host=h, gpu=g), torch.relu(local_base(h, g) - 3))
    assert torch.equal(
        danaus.inspect(both, host=1, gpu=0), torch.relu(local_base(1, 0) - 3) + local_base(1, 0)
    )
    with danaus.no_mesh.activate():  # nor under no_mesh
        z = y * 2
    assert torch.equal(danaus.inspect(z, host=1, gpu=1), torch.relu(local_base(1, 1) - 3) * 2)
    with pytest.raises(ValueError, match="local"):
        x + torch.ones(6)  # a local tensor with mesh tensors is still refused


def test_a_shape_mismatch_raises_at_the_op_before_anything_is_sent(mesh: ProcMesh) -> None:
    with mesh.activate():
        a = torch.ones(2, 3)
        with pytest.raises(RuntimeError, match="same reduction dim"):
            a @ a
        with pytest.raises(RuntimeError, match="inspect"):
            a.sum().item()
        b = a @ a.T
    assert torch.equal(danaus.inspect(b), torch.full((2, 2), 3.0))


def test_fetched_values_stay_usable_under_the_active_mesh(mesh: ProcMesh) -> None:
    with mesh.activate():
        v = danaus.inspect(torch.arange(4) * 3, gpu=1)
        total = v.sum()
        text = repr(v)
    assert type(total) is torch.Tensor and int(total) == 18
    assert text == "tensor([0, 3, 6, 9])"


def _stats(mesh: ProcMesh) -> Any:
    from danaus._tensor.engine import engine_for

    gc.collect()
    engine = engine_for(mesh)
    engine.flush()
    return engine.workers.stats.call().get(timeout=30)


def test_deleting_the_last_handle_frees_the_shards(mesh: ProcMesh) -> None:
    with mesh.activate():
        before = [s["tensors"] for s in _stats(mesh).values()]
        big = [torch.zeros(1000) + i for i in range(5)]
        during = [s["tensors"] for s in _stats(mesh).values()]
        del big
        after = [s["tensors"] for s in _stats(mesh).values()]
    assert all(d >= b + 5 for b, d in zip(before, during, strict=True))
    assert after == before
