"""``reduce`` and ``reduce_``: collectives over named mesh dimensions, checked on the client.

Every check Monarch makes happens here, before anything is sent: the
dimensions exist and do not repeat, ``stack`` and ``scatter`` take one
dimension, ``scatter`` needs an outermost size equal to the dimension's.
The workers then run one ``torch.distributed`` collective per group of
procs that agree on every dimension not reduced.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from torch.utils import _pytree as pytree

from .client import active_mesh, same_mesh
from .engine import engine_for
from .messages import Reduce, ReduceMany
from .stream import check_use
from .tensor import Tensor, implement, meta_empty

if TYPE_CHECKING:
    from .._actor.api.procs import ProcMesh

__all__ = ["REDUCTIONS", "reduce", "reduce_", "reduce_tensor"]

REDUCTIONS = ("sum", "avg", "product", "min", "max", "stack", "band", "bor", "bxor")


@functools.lru_cache(maxsize=1024)  # a pure function of two values: no session state
def _groups(shape: Any, dims: tuple[str, ...]) -> tuple[tuple[int, ...], ...]:
    """Global ranks of ``shape`` split by their coordinates outside ``dims`` (row-major)."""
    keep = [label for label in shape.labels if label not in dims]
    by: dict[tuple[int, ...], list[int]] = {}
    for r in shape.ranks():
        c = shape.coordinates(r)
        by.setdefault(tuple(c[k] for k in keep), []).append(r)
    return tuple(tuple(v) for v in by.values())


def _check_dtype(t: Tensor, reduction: str) -> None:
    if reduction == "avg" and not (t.dtype.is_floating_point or t.dtype.is_complex):
        raise TypeError(
            f"reduction 'avg' needs a floating-point tensor, got dtype {t.dtype}; "
            "convert it first (t.float()) or use 'sum'"
        )
    if reduction in ("band", "bor", "bxor") and (t.dtype.is_floating_point or t.dtype.is_complex):
        raise TypeError(
            f"reduction {reduction!r} needs an integer or bool tensor, got dtype {t.dtype}"
        )


def _validate(
    t: Tensor,
    dims: str | Sequence[str],
    reduction: str,
    scatter: bool,
    mesh: ProcMesh | None,
    inplace: bool,
) -> tuple[tuple[str, ...], list[int]]:
    """Monarch's checks for one tensor; returns the reduced dims and the result's shape."""
    if mesh is not None:
        raise NotImplementedError(
            f"reduce(..., mesh={mesh!r}) is not supported; reduce on the tensor's own mesh, "
            "then move the result with t.to_mesh(...)"
        )
    tm = t._mesh
    labels = list(tm._shape.labels)
    if isinstance(dims, str):
        dims = (dims,)
    dims = tuple(dims)
    for d in dims:
        if d not in labels:
            raise KeyError(f"dim {d!r} not found in {tm!r}; its dimensions are {labels}")
    if not dims:
        dims = tuple(labels)
    if len(set(dims)) != len(dims):
        raise ValueError(f"reducing the same dimension twice: {list(dims)}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction {reduction!r} not supported; reductions are {REDUCTIONS}")
    if len(dims) > 1 and (reduction == "stack" or scatter):
        raise ValueError(
            f"reduction {reduction!r} with scatter={scatter} applies to one dimension only, "
            f"got {list(dims)}; reduce one dimension at a time"
        )
    active = active_mesh()
    if not same_mesh(active, tm):
        raise ValueError(
            f"reduce: the tensor is on mesh {tm!r} but the active mesh is {active!r}; "
            "use `with mesh.activate():` for the tensor's mesh"
        )
    # As Monarch's reduce_: the tensor may be reduced in place through an immutable
    # borrow (its idiom for overlapping gradient all-reduce on a comms stream: borrow,
    # reduce_, drop); only an ``out`` tensor is checked for write access.
    check_use(f"reduce({reduction!r})", [t])
    if t.requires_grad:
        raise ValueError(
            "reduce does not work with autograd: the tensor requires grad. Reduce a detached "
            "tensor (t.detach()) or the gradients after backward()"
        )
    _check_dtype(t, reduction)
    n = tm._shape.extent.sizes[labels.index(dims[0])]
    shape = list(t.shape)
    if scatter:
        if t.ndim == 0 or t.size(0) != n:
            raise TypeError(
                f"When scattering results the outermost dimension of the tensor (sizes "
                f"{shape}) must equal the size of dimension {dims[0]!r} ({n})"
            )
        out_shape = shape if reduction == "stack" else shape[1:]
    else:
        out_shape = [n, *shape] if reduction == "stack" else shape
    if inplace and out_shape != shape:
        raise ValueError(
            f"reduce_({reduction!r}, scatter={scatter}) would change the shape from {shape} to "
            f"{out_shape}; use the out-of-place reduce() instead"
        )
    return dims, out_shape


def reduce_tensor(
    t: Tensor,
    dims: str | Sequence[str],
    reduction: str = "sum",
    scatter: bool = False,
    mesh: ProcMesh | None = None,
    inplace: bool = False,
) -> Tensor:
    """One tensor's collective; see `reduce()`. Never blocks."""
    dims, out_shape = _validate(t, dims, reduction, scatter, mesh, inplace)
    tm = t._mesh
    engine = engine_for(tm)
    out = t if inplace else Tensor(meta_empty(out_shape, t.dtype), tm, engine, t.device)
    groups = _groups(tm._shape, dims)
    cmd = Reduce(out._ref, t._ref, groups, reduction, scatter, inplace, tuple(t.shape), t.dtype)
    engine.send(tm._shape, cmd)
    return out


def _reduce_bucket(ts: list[Tensor], dims: Any, reduction: str, inplace: bool) -> list[Tensor]:
    """Several same-dtype tensors of one mesh all-reduced as one buffer (one collective)."""
    checked = [_validate(t, dims, reduction, False, None, inplace) for t in ts]
    tm = ts[0]._mesh
    engine = engine_for(tm)
    outs = [
        t if inplace else Tensor(meta_empty(list(t.shape), t.dtype), tm, engine, t.device)
        for t in ts
    ]
    cmd = ReduceMany(
        tuple(o._ref for o in outs),
        tuple(t._ref for t in ts),
        _groups(tm._shape, checked[0][0]),
        reduction,
        inplace,
        tuple(tuple(t.shape) for t in ts),
        ts[0].dtype,
    )
    engine.send(tm._shape, cmd)
    return outs


def reduce(
    tensors: Any,
    dims: str | Sequence[str],
    reduction: str = "sum",
    scatter: bool = False,
    mesh: ProcMesh | None = None,
    _inplace: bool = False,
) -> Any:
    """Reduce each mesh tensor of the pytree ``tensors`` over mesh dimensions ``dims``.

    ``reduction`` is one of ``sum, avg, product, min, max, stack, band, bor,
    bxor``; ``dims`` a name, several, or ``()`` for all. Without ``scatter``
    every proc gets the reduction over its group (all-reduce); ``stack``
    gathers the group's shards along a new outermost dimension (all-gather);
    ``scatter=True`` needs an outermost size equal to the dimension's and
    gives the proc at coordinate k row k of the reduction (reduce-scatter).
    Never blocks. Raises ``KeyError`` for an unknown dimension, ``ValueError``
    for a repeated one, an unknown reduction, ``stack``/``scatter`` over
    several dimensions or a tensor requiring grad, ``TypeError`` for a bad
    scatter shape or a dtype the reduction does not take.
    """

    leaves, spec = pytree.tree_flatten(tensors)
    ts = [x for x in leaves if isinstance(x, Tensor)]
    if (
        len(ts) > 1
        and not scatter
        and reduction != "stack"
        and mesh is None
        and all(t._mesh is ts[0]._mesh and t.dtype == ts[0].dtype for t in ts)
    ):
        # one collective for the lot, as DDP's gradient buckets
        done = iter(_reduce_bucket(ts, dims, reduction, _inplace))
        return pytree.tree_unflatten(
            [next(done) if isinstance(x, Tensor) else x for x in leaves], spec
        )

    def one(x: Any) -> Any:
        if isinstance(x, Tensor):
            return reduce_tensor(x, dims, reduction, scatter, mesh, _inplace)
        return x

    return pytree.tree_map(one, tensors)


def reduce_(
    tensors: Any,
    dims: str | Sequence[str],
    reduction: str = "sum",
    scatter: bool = False,
    mesh: ProcMesh | None = None,
) -> Any:
    """In-place `reduce()`: each tensor is overwritten with its result. Never
    blocks."""
    return reduce(tensors, dims, reduction, scatter, mesh, _inplace=True)


implement("reduce", reduce_tensor)
