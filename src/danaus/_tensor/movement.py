"""``to_mesh`` and ``slice_mesh``: moving tensors onto and between meshes.

A local ``torch.Tensor`` moved to a mesh is copied into every proc of it
(its value travels in the command). A mesh tensor moved to another mesh of
the same procs' engine is sent point to point between workers.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import _disable_current_modes

from .engine import engine_for
from .messages import CallOp, SendTo
from .stream import check_use
from .tensor import Tensor, implement

if TYPE_CHECKING:
    from .._actor.api.procs import ProcMesh

__all__ = ["MeshSliceTensor", "slice_mesh", "slice_mesh_tensor", "to_mesh", "to_mesh_tensor"]


def _local_to_mesh(t: torch.Tensor, mesh: ProcMesh) -> Tensor:
    engine = engine_for(mesh)
    with _disable_current_modes():
        value = t.detach().to("cpu").contiguous()
        meta = torch.empty_strided(t.shape, value.stride(), dtype=t.dtype, device="meta")
    out = Tensor(meta, mesh, engine, engine.device)
    engine.send(mesh._shape, CallOp("aten::clone", (value,), {}, (out._ref,), (), True))
    return out


class MeshSliceTensor:
    """A mesh tensor seen on a slice of its mesh (``t.slice_mesh(pp=0)``); only moves.

    Its one use is ``.to_mesh(other)``: the shards of the slice's procs are
    copied to ``other``.
    """

    def __init__(self, tensor: Tensor, mesh: ProcMesh) -> None:
        self._tensor = tensor
        self._mesh = mesh

    @property
    def mesh(self) -> Any:
        return self._mesh

    def to_mesh(self, mesh: ProcMesh) -> Tensor:
        """Copy the slice's shards to ``mesh``; see `to_mesh()`. Never blocks."""
        return _between(self._tensor, self._mesh, mesh)

    def __repr__(self) -> str:
        return f"MeshSliceTensor({self._tensor!r} on {self._mesh!r})"


def _pairs(src: Any, dst: Any) -> tuple[tuple[int, int], ...]:
    """(destination global rank, source global rank) for every proc of ``dst``."""
    s_labels = list(src._shape.labels)
    d_labels = list(dst._shape.labels)
    s_sizes = dict(zip(s_labels, src._shape.extent.sizes, strict=True))
    d_sizes = dict(zip(d_labels, dst._shape.extent.sizes, strict=True))
    extra = [label for label in s_labels if label not in d_sizes]
    if extra:
        raise ValueError(
            f"to_mesh: the source mesh {src!r} has dimension(s) {extra} that the destination "
            f"{dst!r} lacks; reduce over them first or select one coordinate with "
            f"t.slice_mesh({extra[0]}=0)"
        )
    for label in s_labels:
        if s_sizes[label] != d_sizes[label]:
            raise ValueError(
                f"to_mesh: dimension {label!r} has size {s_sizes[label]} on the source mesh "
                f"{src!r} but {d_sizes[label]} on the destination {dst!r}; they must match"
            )
    missing = [label for label in d_labels if label not in s_sizes]
    if missing:
        warnings.warn(
            f"to_mesh: broadcasting along dimension(s) {missing}, which the source mesh "
            f"{src!r} lacks: every proc along them gets the same shard",
            stacklevel=4,
        )
    src_shape = src._shape
    out = []
    for r in dst._shape.ranks():
        c = dst._shape.coordinates(r)
        one = src_shape.index(**{label: c[label] for label in s_labels}) if s_labels else src_shape
        out.append((r, one.ranks()[0]))
    return tuple(out)


def _between(t: Tensor, src: Any, dst: Any) -> Tensor:
    if src._state is not dst._state:
        raise NotImplementedError(
            f"to_mesh between meshes of different spawns ({src!r} -> {dst!r}) is not "
            "supported: both must be slices of one ProcMesh. Fetch the value with "
            "danaus.inspect(t) and move the local tensor instead"
        )
    # Onto its own mesh too, the result is a new tensor (Monarch's SendTensor): writing
    # to it must not change ``t``; each proc's pair is then a local copy.
    check_use("to_mesh", [t])
    pairs = _pairs(src, dst)
    engine = engine_for(dst)
    with _disable_current_modes():
        meta = torch.empty(t.shape, dtype=t.dtype, device="meta")
    out = Tensor(meta, dst, engine, t.device)
    engine.send(
        engine.workers._shape,
        SendTo(t._ref, out._ref, pairs, tuple(t.shape), t.dtype),
    )
    return out


def to_mesh_tensor(t: Any, mesh: ProcMesh) -> Tensor:
    """One tensor's `to_mesh()`. Never blocks."""
    if isinstance(t, MeshSliceTensor):
        return t.to_mesh(mesh)
    if not isinstance(t, Tensor):
        return _local_to_mesh(t, mesh)
    engine_for(mesh)
    return _between(t, t._mesh, mesh)


def slice_mesh_tensor(t: Tensor, **coords: Any) -> MeshSliceTensor:
    """``t`` seen on ``t.mesh.slice(**coords)``; see [`slice_mesh()`][danaus.slice_mesh]. Never
    blocks."""
    return MeshSliceTensor(t, t._mesh.slice(**coords))


def slice_mesh(tensors: Any, **coords: Any) -> Any:
    """Each mesh tensor of ``tensors`` seen on a slice of its mesh, ready for ``to_mesh``.

    ``slice_mesh(t, pp=0).to_mesh(stage1)``. Never blocks; raises like
    ``ProcMesh.slice`` for bad coordinates.
    """
    return pytree.tree_map(
        lambda x: slice_mesh_tensor(x, **coords) if isinstance(x, Tensor) else x, tensors
    )


def to_mesh(tensors: Any, mesh: ProcMesh) -> Any:
    """Copy each tensor of the pytree ``tensors`` onto ``mesh``; returns the new pytree.

    A mesh tensor (or ``slice_mesh`` view) moves between slices of one
    ``ProcMesh``: the destination proc at coordinates c gets the source's
    shard at the same coordinates, for dimensions whose sizes must match;
    along destination dimensions the source lacks it is broadcast, with a
    warning, as Monarch does. A local ``torch.Tensor`` is copied, as is, into
    every proc of ``mesh`` (its value travels in the message: keep it small).
    Never blocks. Raises ``TypeError`` if ``mesh`` is not a ``ProcMesh``,
    ``ValueError`` for dimensions that do not match.
    """
    engine_for(mesh)  # checks the type
    return pytree.tree_map(
        lambda x: to_mesh_tensor(x, mesh) if isinstance(x, (torch.Tensor, MeshSliceTensor)) else x,
        tensors,
    )


implement("to_mesh", to_mesh_tensor)
implement("slice_mesh", slice_mesh_tensor)
