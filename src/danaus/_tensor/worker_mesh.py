"""A worker's view of its device mesh: Monarch's ``monarch.worker.worker.DeviceMesh``.

In Monarch each worker process holds, for every device mesh it is part of,
where it sits in each dimension (``Dim``: its coordinate, the dimension's
size, and the global ranks along that dimension through it) and makes the
``torch.distributed`` process groups a stream's collectives over some
dimensions use. danaus's ``TensorWorker`` gets its groups' ranks from the
client instead (``GroupArg``); this class is the same computation for code
written against Monarch's worker-side mesh.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Sequence
from typing import Any, NamedTuple

__all__ = ["DeviceMesh", "Dim"]


class Dim(NamedTuple):
    """This worker in dimension ``name``: its coordinate ``rank`` of ``size``, and the
    global ranks along the dimension through it (``members[rank]`` is this worker)."""

    name: str
    rank: int
    size: int
    members: list[int]


def _default_group(name: str, ranks: list[int]) -> Any:
    import torch.distributed as dist

    if not dist.is_initialized():
        raise RuntimeError(
            f"DeviceMesh.create_process_group({name!r}): torch.distributed is not initialized "
            "on this worker (call init_process_group first, or give DeviceMesh a group_factory)"
        )
    return dist.new_group(ranks=sorted(ranks), group_desc=name)


class DeviceMesh:
    """Worker ``rank``'s view of mesh ``id``, whose dimensions ``names`` lay out the global
    ranks ``ranks`` (an ``NDSlice``).

    ``dims``: a ``Dim`` per name; ``all_ranks``: every rank of the mesh.
    ``create_process_group(stream, dims)`` makes the process group of this worker's
    slice over ``dims`` for ``stream`` (each stream has its own, so that collectives on
    different streams never interleave); every member must call it for the same
    slices in the same order, as with ``torch.distributed.new_group``.
    ``group_factory(name, ranks)`` makes a group (default:
    ``torch.distributed.new_group`` over the initialised default group).
    """

    def __init__(
        self,
        id: int,
        names: Sequence[str],
        ranks: Any,
        rank: int,
        group_factory: Callable[[str, list[int]], Any] | None = None,
    ) -> None:
        sizes, strides = list(ranks.sizes), list(ranks.strides)
        if len(names) != len(sizes):
            raise ValueError(f"{len(names)} names {list(names)} for a {len(sizes)}-d mesh")
        self.id = id
        self.all_ranks: list[int] = list(ranks)
        if rank not in self.all_ranks:
            raise ValueError(f"rank {rank} is not in the mesh's ranks {ranks!r}")
        coords = list(ranks.coordinates(rank))
        self.dims: dict[str, Dim] = {}
        for name, c, size, stride in zip(names, coords, sizes, strides, strict=True):
            first = rank - c * stride
            self.dims[name] = Dim(name, c, size, [first + i * stride for i in range(size)])
        self._strides = dict(zip(names, strides, strict=True))
        self._group_factory = group_factory or _default_group
        self.process_group_for_stream: dict[Hashable, dict[tuple[Any, tuple[str, ...]], Any]] = {}

    def __repr__(self) -> str:
        where = ", ".join(f"{d.name}={d.rank}/{d.size}" for d in self.dims.values())
        return f"DeviceMesh({self.id}, {where})"

    def get_ranks_for_dim_slice(self, names: Sequence[str]) -> list[int]:
        """The global ranks of the slice through this worker over ``names`` (the other
        coordinates fixed to this worker's), row-major in the order of ``names``; none
        for no names."""
        for n in names:
            if n not in self.dims:
                raise KeyError(f"no dimension {n!r} in {self!r}; its dimensions: {list(self.dims)}")
        if not names:  # as Monarch's: no dimension, no group
            return []
        if list(names) == list(self.dims):
            return list(self.all_ranks)
        dims = [self.dims[n] for n in names]
        base = dims[0].members[dims[0].rank]
        for d in dims:
            base -= d.rank * self._strides[d.name]
        out = []
        for idx in itertools.product(*(range(d.size) for d in dims)):
            out.append(
                base + sum(i * self._strides[d.name] for i, d in zip(idx, dims, strict=True))
            )
        return out

    def _name(self, stream: Hashable, dims: tuple[str, ...], pg: Any) -> str:
        where = "_".join("X" if d.name in dims else str(d.rank) for d in self.dims.values())
        sid = getattr(stream, "id", getattr(stream, "name", stream))
        name = f"mesh_{self.id}_stream_{sid}_{where}"
        return f"{name}_group_{pg}" if pg is not None else name

    def create_process_group(self, stream: Hashable, dims: Sequence[str], pg: Any = None) -> Any:
        """Make (once) and return ``stream``'s process group over ``dims`` (``pg``: the
        controller's reference, when several groups cover the same dims)."""
        key = (pg, tuple(sorted(dims)))
        groups = self.process_group_for_stream.setdefault(stream, {})
        if key in groups:
            raise ValueError(
                f"the process group over {list(key[1])} for stream {stream!r} "
                f"(group {pg!r}) already exists in {self!r}"
            )
        ranks = self.get_ranks_for_dim_slice(key[1])
        groups[key] = self._group_factory(self._name(stream, key[1], pg), ranks)
        return groups[key]

    def get_process_group(self, stream: Hashable, dims: Sequence[str], pg: Any = None) -> Any:
        """``stream``'s process group over ``dims``, made by ``create_process_group``."""
        key = (pg, tuple(sorted(dims)))
        try:
            return self.process_group_for_stream[stream][key]
        except KeyError:
            raise KeyError(
                f"no process group over {list(key[1])} for stream {stream!r} (group {pg!r}) "
                f"in {self!r}; create_process_group first"
            ) from None
