"""The tensor engine's public surface, re-exported by the top-level ``danaus`` package."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from . import TOP_LEVEL
from .active import Activation
from .active import activate as activate
from .active import deactivate as deactivate
from .active import get_active_mesh as get_active_mesh
from .active import no_mesh as no_mesh
from .autograd import grad_function as grad_function
from .autograd import grad_generator as grad_generator
from .coalescing import coalescing as coalescing
from .collectives import reduce as reduce
from .collectives import reduce_ as reduce_
from .engine import engine_for
from .errors import RemoteTensorError as RemoteTensorError
from .fetch import fetch_shard as fetch_shard
from .fetch import inspect as inspect
from .fetch import show as show
from .groups import RemoteProcessGroup as RemoteProcessGroup
from .groups import process_group as process_group  # for ProcMesh.process_group
from .messages import MeshRank
from .movement import slice_mesh as slice_mesh
from .movement import to_mesh as to_mesh
from .remote import Remote
from .remote import call_on_shard_and_fetch as call_on_shard_and_fetch
from .remote import remote as remote
from .rref import actor_rref as actor_rref  # for Endpoint.rref
from .stream import Stream as Stream
from .stream import get_active_stream as get_active_stream
from .tensor import Tensor, meta_empty

if TYPE_CHECKING:
    from .._actor.api.procs import ProcMesh

__all__ = [
    "Activation",
    "Remote",
    "activate",
    "deactivate",
    "mesh_rank",
    "mesh_ranks",
    *TOP_LEVEL,  # the names danaus shows at its top level
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
