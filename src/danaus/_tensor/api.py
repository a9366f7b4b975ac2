"""The tensor engine's public surface, re-exported by the top-level ``danaus`` package."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from .active import Activation, get_active_mesh, no_mesh
from .active import activate as activate
from .active import deactivate as deactivate
from .autograd import grad_function, grad_generator
from .coalescing import coalescing
from .collectives import reduce, reduce_
from .engine import engine_for
from .errors import RemoteTensorError
from .fetch import fetch_shard, inspect, show
from .groups import RemoteProcessGroup
from .groups import process_group as process_group  # for ProcMesh.process_group
from .messages import MeshRank
from .movement import slice_mesh, to_mesh
from .remote import Remote, call_on_shard_and_fetch, remote
from .rref import actor_rref as actor_rref  # for Endpoint.rref
from .stream import Stream, get_active_stream
from .tensor import Tensor, meta_empty

if TYPE_CHECKING:
    from .._actor.api.procs import ProcMesh

__all__ = [
    "Activation",
    "Remote",
    "RemoteProcessGroup",
    "RemoteTensorError",
    "Stream",
    "Tensor",
    "activate",
    "call_on_shard_and_fetch",
    "coalescing",
    "deactivate",
    "fetch_shard",
    "get_active_mesh",
    "get_active_stream",
    "grad_function",
    "grad_generator",
    "inspect",
    "mesh_rank",
    "mesh_ranks",
    "no_mesh",
    "reduce",
    "reduce_",
    "remote",
    "show",
    "slice_mesh",
    "to_mesh",
]


def mesh_rank(mesh: ProcMesh, dims: str | Sequence[str]) -> Tensor:
    """A tensor on ``mesh`` holding each proc's coordinate along ``dims``. Never blocks.

    For several dimensions, the row-major combination of their coordinates.
    Raises ``KeyError`` for a dimension the mesh lacks.
    """
    labels = list(mesh._shape.labels)
    if isinstance(dims, str):
        if dims not in labels:
            raise KeyError(
                f"{mesh!r} does not have dimension {dims!r}; its dimensions are {labels}"
            )
        engine = engine_for(mesh)
        meta = meta_empty((), dtype=torch.long)
        out = Tensor(meta, mesh, engine, engine.device)
        engine.send(mesh._shape, MeshRank(out._ref, mesh._shape, dims))
        return out
    dims = list(dims)
    for d in dims:
        if d not in labels:
            raise KeyError(f"{mesh!r} does not have dimension {d!r}; its dimensions are {labels}")
    sizes = dict(zip(labels, mesh._shape.extent.sizes, strict=True))
    with activate(mesh):
        combined: Any = torch.zeros((), dtype=torch.long)
        for d in dims:
            combined = combined * sizes[d] + mesh_rank(mesh, d)
    return combined  # type: ignore[no-any-return]


def mesh_ranks(mesh: ProcMesh) -> dict[str, Tensor]:
    """``{dim: mesh_rank(mesh, dim)}`` for each dimension. Never blocks."""
    return {d: mesh_rank(mesh, d) for d in mesh._shape.labels}


for _name in __all__:
    if _name not in ("Activation", "activate", "deactivate", "mesh_rank", "mesh_ranks"):
        globals()[_name].__module__ = "danaus"
del _name
