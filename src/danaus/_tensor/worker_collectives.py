"""A tensor worker's reductions (``Reduce``, ``ReduceMany``): the data collective, with
every member's failure flag agreed alongside it, so a result fails on every rank or on
none."""

from __future__ import annotations

from typing import Any, Protocol

import torch
import torch.distributed as dist

from .errors import Failure
from .messages import Reduce, ReduceMany

_REDUCE_OPS = {
    "sum": "SUM",
    "avg": "SUM",
    "product": "PRODUCT",
    "min": "MIN",
    "max": "MAX",
    "band": "BAND",
    "bor": "BOR",
    "bxor": "BXOR",
}


class Worker(Protocol):
    """What a reduction uses of the tensor worker it runs on (``worker.TensorWorker``)."""

    rank: int
    device: torch.device
    refs: dict[int, Any]

    def _group(self, ranks: tuple[int, ...]) -> Any: ...

    def _fail(self, ids: Any, failure: Failure) -> None: ...

    def _failure(self, op: str, e: BaseException) -> Failure: ...


def _input_failed(name: str, origin: int) -> Failure:
    """The failure of a collective whose input failed on member ``origin``."""
    return Failure(
        name, origin, "RemoteTensorError", f"the input of {name} failed on rank {origin}", ""
    )


def _exact_bits(dtype: Any) -> int:
    """Powers of two a float dtype sums exactly (its mantissa bits); 0 for other dtypes."""
    return {torch.float32: 24, torch.float64: 53}.get(dtype, 0)


def _allreduce_options(op: Any) -> Any:
    opts = dist.AllreduceOptions()
    opts.reduceOp = op
    return opts


def reduce(w: Worker, cmd: Reduce) -> None:
    """Run a ``Reduce`` on worker ``w``: its result, or its failure on every member."""
    name = f"reduce({cmd.reduction!r}, scatter={cmd.scatter})"
    group = next(g for g in cmd.groups if w.rank in g)
    n = len(group)
    src = w.refs.get(cmd.src)
    failure: Failure | None = None
    if not isinstance(src, torch.Tensor):
        failure = src if isinstance(src, Failure) else w._failure(name, KeyError(cmd.src))
        src = torch.zeros(cmd.shape, dtype=cmd.dtype, device=w.device)
    try:
        pg = w._group(group) if n > 1 else None
        # the flag goes alongside the data, not before it: one round trip, not two
        agreement = _start_agreement(w, pg, failure)
        result = _collective(cmd, src, pg, n, group.index(w.rank))
        failure = _finish_agreement(agreement, failure, name)
    except Exception as e:
        w._fail((cmd.out, cmd.src) if cmd.inplace else (cmd.out,), w._failure(name, e))
        return
    if failure is not None:
        w._fail((cmd.out, cmd.src) if cmd.inplace else (cmd.out,), failure)
        return
    if cmd.inplace:
        if result is not src:
            src.copy_(result)
        result = src
    w.refs[cmd.out] = result


def _start_agreement(w: Worker, pg: Any, failure: Failure | None) -> Any:
    """Start telling every member whether this one's input failed (a MAX all-reduce).

    Members whose input failed still join the data collective (with
    zeros), so the group stays matched; all outputs then fail together.
    """
    if pg is None:
        return None
    flag = torch.tensor([0 if failure is None else 1 + w.rank], dtype=torch.long, device=w.device)
    return pg.allreduce([flag], _allreduce_options(dist.ReduceOp.MAX)), flag


def _finish_agreement(started: Any, failure: Failure | None, name: str) -> Any:
    """Wait for `_start_agreement()`; the failure of some member, or ``None``."""
    if started is None:
        return failure
    work, flag = started
    work.wait()
    if failure is None and int(flag) > 0:
        origin = int(flag) - 1
        failure = _input_failed(name, origin)
    return failure


def reduce_many(w: Worker, cmd: ReduceMany) -> None:
    """Run a ``ReduceMany`` (one all-reduce of a bucket of tensors) on worker ``w``."""
    name = f"reduce({cmd.reduction!r}) of {len(cmd.srcs)} tensors"
    group = next(g for g in cmd.groups if w.rank in g)
    failure: Failure | None = None
    tensors = []
    for i, shape in zip(cmd.srcs, cmd.shapes, strict=True):
        v = w.refs.get(i)
        if not isinstance(v, torch.Tensor):
            if failure is None:
                failure = v if isinstance(v, Failure) else w._failure(name, KeyError(i))
            v = torch.zeros(shape, dtype=cmd.dtype, device=w.device)
        tensors.append(v)
    written = (*cmd.outs, *cmd.srcs) if cmd.inplace else cmd.outs
    try:
        pg = w._group(group) if len(group) > 1 else None
        me = group.index(w.rank)
        # a sum's flag rides in the bucket itself (one more element: member k adds 2**k
        # when its input failed); other reductions all-reduce it alongside
        inline = (
            pg is not None
            and cmd.reduction in ("sum", "avg")
            and _exact_bits(cmd.dtype) > len(group)
        )
        agreement = None if inline else _start_agreement(w, pg, failure)
        pieces = [t.reshape(-1) for t in tensors]
        if inline:
            bit = float(2**me) if failure is not None else 0.0
            pieces.append(torch.full((1,), bit, dtype=cmd.dtype, device=w.device))
        flat = torch.cat(pieces)
        if pg is not None:
            op = getattr(dist.ReduceOp, _REDUCE_OPS[cmd.reduction])
            pg.allreduce([flat], _allreduce_options(op)).wait()
        if inline:
            bits = int(flat[-1].item())
            if failure is None and bits:
                origin = group[(bits & -bits).bit_length() - 1]
                failure = _input_failed(name, origin)
            flat = flat[:-1]
        else:
            failure = _finish_agreement(agreement, failure, name)
        if cmd.reduction == "avg":
            flat.div_(len(group))
    except Exception as e:
        w._fail(written, w._failure(name, e))
        return
    if failure is not None:
        w._fail(written, failure)
        return
    offset = 0
    for out, t in zip(cmd.outs, tensors, strict=True):
        piece = flat[offset : offset + t.numel()].view(t.shape)
        offset += t.numel()
        if cmd.inplace:
            t.copy_(piece)
            piece = t
        w.refs[out] = piece


def _collective(cmd: Reduce, src: torch.Tensor, pg: Any, n: int, me: int) -> Any:
    if cmd.reduction == "stack":
        if pg is None:
            gathered = [src.clone()]
        else:
            gathered = [torch.empty_like(src) for _ in range(n)]
            pg.allgather([gathered], [src.contiguous()]).wait()
        if cmd.scatter:  # all-to-all: row ``me`` of every member's input
            return torch.stack([g[me] for g in gathered])
        return torch.stack(gathered)
    if cmd.inplace and not cmd.scatter and src.is_contiguous():
        out = src  # reduce straight into the shard: no copies
    else:
        out = src.detach().clone(memory_format=torch.contiguous_format)
    if pg is not None:
        op = getattr(dist.ReduceOp, _REDUCE_OPS[cmd.reduction])
        pg.allreduce([out], _allreduce_options(op)).wait()
    if cmd.reduction == "avg":
        out.div_(n)
    if cmd.scatter:
        return out[me].clone()
    return out
