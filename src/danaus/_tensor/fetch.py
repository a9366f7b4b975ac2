"""``fetch_shard``, ``inspect`` and ``show``: bring one shard's values back to the client."""

from __future__ import annotations

import concurrent.futures
from typing import TYPE_CHECKING, Any

from torch.utils import _pytree as pytree

from .._actor.core.future import Deferred, Future, resolve
from .._errors import SupervisionError
from .coalescing import check_not_coalescing
from .engine import engine_for
from .errors import Failure, RemoteTensorError
from .tensor import Tensor

if TYPE_CHECKING:
    from .._actor.api.procs import ProcMesh

__all__ = ["fetch_shard", "inspect", "show"]


def _shard_rank(mesh: ProcMesh, shard: dict[str, int] | None, coords: dict[str, int]) -> Any:
    """The one-proc shape of ``mesh`` at ``coords`` (0 along dimensions not given)."""
    where = {**(shard or {}), **coords}
    labels = list(mesh._shape.labels)
    for k in where:
        if k not in labels:
            raise ValueError(
                f"fetch_shard: mesh {mesh!r} has no dimension {k!r}; its dimensions are {labels}"
            )
    full = {label: where.get(label, 0) for label in labels}
    try:
        return mesh._shape.index(**full) if full else mesh._shape
    except (IndexError, ValueError, TypeError) as e:
        raise ValueError(f"fetch_shard: bad coordinates {where!r} for mesh {mesh!r}: {e}") from e


def _settle(cf: concurrent.futures.Future[Any], ok: bool, value: Any) -> None:
    """Complete ``cf`` unless a worker's death already failed it."""
    try:
        if ok:
            cf.set_result(value)
        else:
            cf.set_exception(value)
    except concurrent.futures.InvalidStateError:
        pass


def fetch_shard(obj: Any, shard: dict[str, int] | None = None, **coords: int) -> Future[Any]:
    """Fetch ``obj`` (a pytree of mesh tensors) as held by one proc; returns a ``Future``.

    The proc is given by ``shard`` or keyword coordinates (``gpu=1``); a
    dimension not named is taken at 0. Does not block; the future's value is
    ``obj`` with each mesh tensor replaced by a CPU ``torch.Tensor``, and it
    raises ``RemoteTensorError`` if one of them failed to compute (naming the
    op that failed first, its rank and traceback) or ``SupervisionError`` if
    the proc died. Raises ``ValueError`` at once for tensors of different
    meshes or unknown coordinates.
    """
    leaves, spec = pytree.tree_flatten(obj)
    tensors = [(i, x) for i, x in enumerate(leaves) if isinstance(x, Tensor)]
    if not tensors:
        return Future._resolved(obj, "fetch_shard")
    check_not_coalescing("fetching a mesh tensor")
    mesh = tensors[0][1]._mesh
    for _, t in tensors:
        if t._mesh is not mesh and not (
            t._mesh._state is mesh._state and t._mesh._shape == mesh._shape
        ):
            raise ValueError(
                f"fetch_shard: the tensors are on different meshes ({mesh!r} and "
                f"{t._mesh!r}); fetch them separately"
            )
    one = _shard_rank(mesh, shard, coords)
    rank = one.ranks()[0]
    where = {**(shard or {}), **coords}
    engine = engine_for(mesh)
    cf: concurrent.futures.Future[Any] = concurrent.futures.Future()
    engine.watch(cf)
    if cf.done():  # a worker of this mesh died
        return Future._create(cf, "fetch_shard")
    engine.flush()
    with engine.as_owner():
        inner = engine.targets(one).fetch.call_one([t._ref for _, t in tensors])

    def done(_: Any) -> None:
        if cf.done():
            return
        exc = inner._cf.exception()
        if exc is not None:
            if isinstance(exc, SupervisionError):
                engine.worker_lost(rank, exc)  # before the caller can see the failure
            _settle(cf, False, exc)
            return
        reply = inner._cf.result()

        def build() -> Any:  # on the reader's thread: the reply is unpickled there
            values = resolve(reply)
            out = list(leaves)
            for (i, _t), v in zip(tensors, values, strict=True):
                if isinstance(v, Failure):
                    raise RemoteTensorError(v, rank, where)
                v._danaus_fetched = True  # usable under an active mesh (see tensor.dispatch)
                out[i] = v
            return pytree.tree_unflatten(out, spec)

        _settle(cf, True, Deferred(build))

    inner._cf.add_done_callback(done)
    return Future._create(cf, f"fetch_shard at {where or 'rank ' + str(rank)}")


def inspect(obj: Any, shard: dict[str, int] | None = None, **coords: int) -> Any:
    """The value of ``obj`` on one proc (``fetch_shard(...).result()``). Blocks.

    Raises what `fetch_shard()`'s future raises.
    """
    return fetch_shard(obj, shard, **coords).result()


def show(obj: Any, shard: dict[str, int] | None = None, **coords: int) -> Any:
    """Print one proc's value of ``obj`` (with ``torchshow`` if installed). Blocks."""
    value = inspect(obj, shard, **coords)
    try:
        import torchshow
    except ImportError:
        print(value)
        return None
    return torchshow.show(value)
