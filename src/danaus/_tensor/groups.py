"""``ProcMesh.process_group(dims)``: a torch.distributed process group for remote functions.

The client holds a [`RemoteProcessGroup`][danaus.RemoteProcessGroup], a handle naming mesh
dimensions. Passed to a ``remote`` function, it travels as a
`GroupArg` (the groups of global ranks,
split as ``reduce`` splits them: the procs that agree on every dimension not
named), and each worker hands the function a real ``torch.distributed``
``ProcessGroup`` of its group (gloo on CPU, NCCL for CUDA workers), so
``torch.distributed.all_reduce(t, group=pg)`` works inside it. On the client,
where ``propagate`` computes result shapes, the function gets a
`DummyProcessGroup` of the same size whose collectives do nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from .collectives import _groups
from .messages import GroupArg
from .worker import register_group_ranks, unregister_group_ranks

if TYPE_CHECKING:
    from .._actor.api.procs import ProcMesh

__all__ = ["DummyProcessGroup", "RemoteProcessGroup", "process_group"]


def _check_dims(mesh: ProcMesh, dims: Any) -> tuple[str, ...]:
    labels = list(mesh._shape.labels)
    if isinstance(dims, str):
        dims = (dims,)
    elif not isinstance(dims, Sequence):
        raise TypeError(
            f"process_group(dims) takes a dimension name or a sequence of names, got {dims!r}"
        )
    names: tuple[str, ...] = tuple(dims)
    for d in names:
        if not isinstance(d, str):
            raise TypeError(f"process_group: a dimension is named by a string, got {d!r}")
        if d not in labels:
            raise ValueError(
                f"process_group: dimension {d!r} not found in {mesh!r}; its dimensions are {labels}"
            )
    repeated = sorted({d for d in names if names.count(d) > 1})
    if repeated:
        raise ValueError(
            f"process_group: dimension {repeated[0]!r} is named twice in {list(names)}; "
            f"{mesh!r} has dimensions {labels}"
        )
    return names


class RemoteProcessGroup:
    """The client's handle of a process group over dimensions ``dims`` of a proc mesh.

    Made by ``mesh.process_group(dims)``. Pass it to a ``danaus.remote``
    function run on every proc (``call_on_shard_and_fetch`` runs on one proc, so
    it takes only a group of one): on each worker the function receives a
    ``torch.distributed.ProcessGroup`` of the procs that share its coordinates
    on every dimension not in ``dims`` (the groups ``reduce(..., dims)`` uses),
    for ``torch.distributed`` collectives. It is gloo on CPU workers, NCCL on
    CUDA workers with a GPU each, and gloo where members share a GPU (gloo
    takes CUDA tensors for all-reduce and broadcast only). Group ranks follow
    the mesh's row-major order; ``src``/``dst`` arguments taking global ranks
    take the procs' ranks in the spawned mesh; there is no default group, so
    use ``pg.rank()``/``pg.size()`` (``dist.get_rank(pg)`` and
    ``dist.get_backend(pg)`` raise). It does nothing on the client: its
    collectives raise ``AttributeError`` there.
    """

    def __init__(self, dims: str | Sequence[str], mesh: ProcMesh) -> None:
        self.dims = _check_dims(mesh, dims)
        self.device_mesh = mesh
        self._groups = _groups(mesh._shape, self.dims)
        self._dropped = False

    @property
    def mesh(self) -> ProcMesh:
        """The proc mesh whose dimensions ``dims`` name (Monarch: ``device_mesh``)."""
        return self.device_mesh

    def size(self) -> int:
        """The number of procs in each group: the product of the sizes of ``dims``."""
        shape = self.device_mesh._shape
        sizes = dict(zip(shape.labels, shape.extent.sizes, strict=True))
        return math.prod(sizes[d] for d in self.dims)

    def drop(self) -> None:
        """Stop using this handle; passing it to a remote function afterwards raises."""
        self._dropped = True

    @property
    def dropped(self) -> bool:
        """Whether `drop()` was called."""
        return self._dropped

    def _wire(self) -> GroupArg:
        """What a command carries in this handle's place."""
        if self._dropped:
            raise ValueError(f"{self!r} was dropped; make a new one with mesh.process_group(...)")
        return GroupArg(self._groups, self.dims)

    def __getattr__(self, name: str) -> Any:
        # Only called for names the class lacks: torch's collectives (allreduce, rank, ...).
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(
            f"{type(self).__name__} has no attribute {name!r}: it is the client's handle of a "
            "process group that exists only on the workers. Pass it to a function made with "
            "danaus.remote; there it is a torch.distributed.ProcessGroup"
        )

    def __reduce__(self) -> Any:
        raise TypeError(
            f"{self!r} cannot be pickled or sent to actors; pass it to a danaus.remote function"
        )

    def __repr__(self) -> str:
        return f"<RemoteProcessGroup dims={list(self.dims)} of {self.device_mesh!r}>"


def process_group(mesh: ProcMesh, dims: str | Sequence[str]) -> RemoteProcessGroup:
    """``mesh.process_group(dims)``: see [`RemoteProcessGroup`][danaus.RemoteProcessGroup]."""
    return RemoteProcessGroup(dims, mesh)


class _DoneWork:
    """The finished work of a `DummyProcessGroup`'s collective."""

    def __init__(self, result: Any) -> None:
        self._result = result

    def wait(self, timeout: Any = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def result(self) -> Any:
        return self._result


def _done(name: str) -> Any:
    def collective(self: DummyProcessGroup, *args: Any, **kwargs: Any) -> _DoneWork:
        return _DoneWork(args[0] if args else None)

    collective.__name__ = name
    collective.__doc__ = f"Does nothing (``propagate`` runs on meta tensors): {name}."
    return collective


class DummyProcessGroup(dist.ProcessGroup):
    """What a remote function's ``propagate`` gets on the client in place of a process group.

    Rank 0 of a group of ``size`` procs; its collectives do nothing and return
    finished work, so ``torch.distributed.all_reduce(t, group=pg)`` on meta
    tensors leaves them as they are. ``ranks``: the global ranks of the group
    it stands for, which ``src=`` arguments name (known to torch while
    ``propagate`` runs: see `dummy_for()`).
    """

    def __init__(self, dims: tuple[str, ...], size: int, ranks: tuple[int, ...] = ()) -> None:
        super().__init__(0, size)  # type: ignore[call-arg]  # the store-less overload
        self.dims = dims
        self.world_size = size
        self.ranks = ranks

    allreduce = _done("allreduce")
    allreduce_coalesced = _done("allreduce_coalesced")
    allgather = _done("allgather")
    allgather_coalesced = _done("allgather_coalesced")
    allgather_into_tensor_coalesced = _done("allgather_into_tensor_coalesced")
    _allgather_base = _done("_allgather_base")
    reduce_scatter = _done("reduce_scatter")
    reduce_scatter_tensor_coalesced = _done("reduce_scatter_tensor_coalesced")
    _reduce_scatter_base = _done("_reduce_scatter_base")
    broadcast = _done("broadcast")
    reduce = _done("reduce")
    gather = _done("gather")
    scatter = _done("scatter")
    alltoall = _done("alltoall")
    alltoall_base = _done("alltoall_base")
    barrier = _done("barrier")
    send = _done("send")
    recv = _done("recv")
    recv_anysource = _done("recv_anysource")

    def __repr__(self) -> str:
        return f"<DummyProcessGroup dims={list(self.dims)} size={self.world_size}>"


def dummy_for(x: Any) -> Any:
    """A `DummyProcessGroup` for a [`RemoteProcessGroup`][danaus.RemoteProcessGroup] (standing for
    its
    first group, whose global ranks torch knows until `forget_dummy()`), anything
    else as is."""
    if isinstance(x, RemoteProcessGroup):
        dummy = DummyProcessGroup(x.dims, x.size(), x._groups[0])
        register_group_ranks(dummy, dummy.ranks)
        return dummy
    return x


def forget_dummy(x: Any) -> None:
    """Undo what `dummy_for()` told torch, for a dummy it made (anything else: nothing)."""
    if type(x) is DummyProcessGroup:
        unregister_group_ranks(x)
