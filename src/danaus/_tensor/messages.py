"""The commands the client sends to tensor-engine workers, one small record each.

Every command names the worker-side tensors it reads through ``Ref`` and the
ids it defines as plain ints; the client allocates ids, so it never waits
for a worker to learn a result's name. Commands are ``NamedTuple``s: they
pickle and unpickle several times faster than dataclasses, which matters at
one command per torch op.
"""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = [
    "BorrowCreate",
    "BorrowDrop",
    "CallOp",
    "Delete",
    "GroupArg",
    "HandOff",
    "MeshRank",
    "Reduce",
    "ReduceMany",
    "Ref",
    "RunRemote",
    "SendTo",
    "Signal",
    "Wait",
]


class Ref(NamedTuple):
    """A worker-side tensor named by id, inside a command's arguments."""

    id: int


class CallOp(NamedTuple):
    """Run the torch operator ``op`` (``"aten::add.Tensor"``) on the local shards.

    ``outs`` names each tensor leaf of the result in pytree order (``None``
    where the client does not keep it); ``mutates`` are ids the op writes in
    place, which become failed when the op fails.
    """

    op: str
    args: Any
    kwargs: Any
    outs: tuple[int | None, ...]
    mutates: tuple[int, ...]
    factory: bool


class Delete(NamedTuple):
    """Drop these ids from the worker's table (the client's handles are gone)."""

    ids: tuple[int, ...]


class MeshRank(NamedTuple):
    """Define ``out`` as this worker's coordinate along ``dim`` of the mesh ``shape``."""

    out: int
    shape: Any  # the mesh's ``Shape``: labels and global ranks
    dim: str


class Reduce(NamedTuple):
    """A collective over groups of global ranks; this worker joins the group holding it.

    ``reduction`` is one of sum, avg, product, min, max, stack, band, bor,
    bxor; ``inplace`` writes the result into ``src``.
    """

    out: int
    src: int
    groups: tuple[tuple[int, ...], ...]
    reduction: str
    scatter: bool
    inplace: bool
    shape: tuple[int, ...]
    dtype: Any


class ReduceMany(NamedTuple):
    """One all-reduce of several tensors of one dtype, packed into one buffer (a bucket)."""

    outs: tuple[int, ...]
    srcs: tuple[int, ...]
    groups: tuple[tuple[int, ...], ...]
    reduction: str
    inplace: bool
    shapes: tuple[tuple[int, ...], ...]
    dtype: Any


class RunRemote(NamedTuple):
    """Call ``fn(*args, **kwargs)`` on local shards; define ``outs`` from its tensor leaves.

    ``fn`` is a resolvable (``function.resolvable_function``): the worker calls its
    ``resolve()`` for the function.
    ``groups``: the arguments hold ``GroupArg``s, which the worker replaces
    with its process groups (looked for only then).
    """

    fn: Any
    args: Any
    kwargs: Any
    outs: tuple[int | None, ...]
    mutates: tuple[int, ...]
    groups: bool = False


class GroupArg:
    """A ``RemoteProcessGroup`` inside a remote function's arguments: the worker passes
    the ``torch.distributed`` process group of the one of ``groups`` (global ranks,
    in group-rank order) that holds it. Not a tuple, so ``Ref`` lookups pass it by."""

    __slots__ = ("dims", "groups")

    def __init__(self, groups: tuple[tuple[int, ...], ...], dims: tuple[str, ...]) -> None:
        self.groups = groups
        self.dims = dims

    def __reduce__(self) -> Any:
        return (GroupArg, (self.groups, self.dims))

    def __repr__(self) -> str:
        return f"GroupArg(dims={list(self.dims)})"


class SendTo(NamedTuple):
    """Point-to-point copy between two meshes' workers (``to_mesh``).

    ``pairs`` maps each destination global rank to its source global rank.
    """

    src: int | None
    out: int | None
    pairs: tuple[tuple[int, int], ...]
    shape: tuple[int, ...]
    dtype: Any


class Signal(NamedTuple):
    """On its stream: mark that every earlier command of this stream has run (event ``key``)."""

    key: int


class Wait(NamedTuple):
    """On its stream: run nothing further until another stream reaches ``Signal(key)``."""

    key: int


class BorrowCreate(NamedTuple):
    """On the borrowing stream: wait for ``Signal(key)`` on the origin; ``out`` aliases ``src``."""

    key: int
    out: int
    src: int


class BorrowDrop(NamedTuple):
    """On the borrowing stream: forget ``alias`` and signal ``key`` (the origin waits on it).

    A failure recorded on a mutable borrow goes back to ``src``: the origin
    sees that its tensor was written by an op that failed.
    """

    key: int
    alias: int
    src: int
    mutable: bool


class HandOff(NamedTuple):
    """On its stream: give local shards to an actor's endpoint call, and wait for it to return
    (then, for ``rref``, define ``outs`` from what it returned).

    ``refs`` are ``(argument index, id)``; ``ranks`` maps each worker's global
    rank to the rank of the actor of mesh ``mesh_id`` on its proc (workers
    not listed do nothing). See ``danaus._actor.core.handoff``.
    """

    key: str
    total: int  # handed-off arguments of the call, from every mesh
    refs: tuple[tuple[int, int], ...]
    mesh_id: str
    ranks: tuple[tuple[int, int], ...]
    # ``endpoint.rref``: the ids its result's tensors get, in ``tree_leaves`` order
    # (None: a plain call, whose result is not kept).
    outs: tuple[int, ...] | None = None
    what: str = ""  # "linear.forward()", for the results' failures
