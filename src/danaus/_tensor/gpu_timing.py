"""CUDA kernel and copy time of a tensor engine worker's commands (issue 41, part 5).

``timed(run_one, device)`` is what a worker's streams run: ``run_one`` itself on a
CPU worker (nothing added), and on a CUDA one a wrapper that records a CUDA timing
event on the stream's current CUDA stream before and after each command that runs
GPU work: ``copy`` for ops that move or copy tensors (``aten::copy_``,
``aten::_to_copy``, ... and ``SendTo``), ``kernel`` for every other op, remote
function and reduction. The events are read when they have completed
(``danaus._actor.core.gpu``: the proc's ``gpus`` rows, Prometheus's
``danaus_gpu_*`` and ``cuda.kernel`` / ``cuda.copy`` spans).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .._actor.core import gpu, telemetry
from .function import target_name
from .messages import CallOp, Reduce, ReduceMany, RunRemote, SendTo

__all__ = ["COPY_OPS", "kind_of", "timed"]

#: The ATen ops timed as copies (the rest as kernels).
COPY_OPS = frozenset(
    {
        "aten::copy_",
        "aten::copy",
        "aten::_to_copy",
        "aten::to",
        "aten::_copy_from",
        "aten::_copy_from_and_resize",
        "aten::clone",
        "aten::contiguous",
    }
)


def kind_of(cmd: Any) -> tuple[str, str] | None:
    """``(kind, name)`` of a command that runs GPU work (kind ``"kernel"`` or
    ``"copy"``), None for bookkeeping (deletes, borrows, signals, hand-offs)."""
    t = type(cmd)
    if t is CallOp:
        base = cmd.op.partition(".")[0]
        return (gpu.COPY if base in COPY_OPS else gpu.KERNEL), cmd.op
    if t is RunRemote:
        return gpu.KERNEL, f"remote {target_name(cmd.fn)}"
    if t is Reduce or t is ReduceMany:
        return gpu.KERNEL, f"reduce {cmd.reduction}"
    if t is SendTo:
        return gpu.COPY, "send_to"
    return None


def timed(run_one: Callable[[Any], None], device: Any) -> Callable[[Any], None]:
    """``run_one`` with each GPU command timed by CUDA events (``run_one`` itself
    unless ``device`` is a CUDA device). Made on the worker's actor thread, whose
    actor names the spans."""
    if getattr(device, "type", None) != "cuda":
        return run_one
    index = device.index or 0
    attrs = {k.removeprefix("danaus."): v for k, v in telemetry.actor_attributes().items()}
    attrs.pop("endpoint", None)
    actor = f"{attrs['mesh']}[{attrs['rank']}]" if "mesh" in attrs else None
    rt = telemetry._runtime()
    out = gpu.sink(rt, actor, attrs) if rt is not None else None
    clock = time.perf_counter_ns

    def run(cmd: Any) -> None:
        what = kind_of(cmd)
        cuda = gpu._cuda() if what is not None else None
        if cuda is None:
            run_one(cmd)
            return
        queued = clock()
        start = gpu.op_started(cuda)
        try:
            run_one(cmd)
        finally:
            gpu.op_ended(cuda, start, index, what[0], what[1], queued, out)  # type: ignore[index]

    return run
