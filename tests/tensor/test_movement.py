"""Moving tensors between slices of a mesh (pipeline stages) and onto a mesh from the client."""

from __future__ import annotations

import warnings

import pytest

import danaus
from danaus.actor import ProcMesh

from .conftest import COORDS, base, local_base, torch

pytestmark = pytest.mark.torch


def test_to_mesh_moves_each_shard_to_the_same_coordinates_of_the_next_stage(
    mesh: ProcMesh,
) -> None:
    stages = [mesh.slice(host=0), mesh.slice(host=1)]
    with stages[0].activate():
        x = torch.arange(4.0) + stages[0].rank("gpu") * 100
    y = x.to_mesh(stages[1])
    with stages[1].activate():
        z = y * 2
    assert z.mesh is stages[1]
    for g in range(2):
        assert torch.equal(danaus.inspect(z, gpu=g), (torch.arange(4.0) + g * 100) * 2)


def test_to_mesh_broadcasts_along_dimensions_the_source_lacks_with_a_warning(
    mesh: ProcMesh,
) -> None:
    with mesh.activate():
        x = base(mesh)
    with pytest.warns(UserWarning, match="broadcasting along dimension"):
        y = danaus.slice_mesh(x, host=1, gpu=0).to_mesh(mesh)
    for h, g in COORDS:
        assert torch.equal(danaus.inspect(y, host=h, gpu=g), local_base(1, 0))


def test_slice_mesh_then_to_mesh_copies_one_row_onto_the_other(mesh: ProcMesh) -> None:
    row1 = mesh.slice(host=1)
    with mesh.activate():
        x = base(mesh)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        moved = danaus.to_mesh(x.slice_mesh(host=0), row1)
    for g in range(2):
        assert torch.equal(danaus.inspect(moved, gpu=g), local_base(0, g))


def test_to_mesh_rejects_dimensions_that_do_not_match(mesh: ProcMesh) -> None:
    with mesh.activate():
        x = base(mesh)
    with pytest.raises(ValueError, match="lacks"):
        x.to_mesh(mesh.slice(host=0))
    with pytest.raises(ValueError, match="must match"):
        x.slice_mesh(gpu=slice(0, 1)).to_mesh(mesh)


def test_a_failed_source_fails_the_moved_tensor(mesh: ProcMesh) -> None:
    stages = [mesh.slice(host=0), mesh.slice(host=1)]
    with stages[0].activate():
        bad = torch.ones(3)[torch.tensor([7])]
    moved = bad.to_mesh(stages[1])
    with pytest.raises(danaus.RemoteTensorError):
        danaus.inspect(moved, gpu=1)


def test_to_mesh_copies_a_local_tensor_into_every_proc(mesh: ProcMesh) -> None:
    local = torch.arange(5) * 7
    t = danaus.to_mesh({"v": local}, mesh)["v"]
    with mesh.activate():
        u = t + mesh.rank("gpu")
    for h, g in COORDS:
        assert torch.equal(danaus.inspect(u, host=h, gpu=g), local + g)


def test_to_mesh_onto_the_tensors_own_mesh_is_a_copy_not_the_same_tensor(mesh) -> None:
    # As Monarch's to_mesh (a SendTensor even when source and destination are one mesh):
    # the result is a tensor of its own, so writing to it leaves the source as it was.
    with mesh.activate():
        x = torch.ones(3)
        y = x.to_mesh(mesh)
        assert y is not x
        y.add_(1)
    assert torch.equal(danaus.inspect(x), torch.ones(3))
    assert torch.equal(danaus.inspect(y), torch.full((3,), 2.0))
