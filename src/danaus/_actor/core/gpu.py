"""GPU activity of this process (issue 41, part 5): CUDA kernel and copy time, GPU
memory, and data-plane transfers, for the telemetry tables and Prometheus.

What each proc answers under ``"gpu"`` in its ``STATS`` answer (``observe``, a
runtime observer that ``telemetry.install`` registers):

- ``devices``: one entry per CUDA device this process used (memory reserved on it,
  or an op timed on it): ``device`` (``"cuda:0"``), ``name``, ``allocated``,
  ``reserved``, ``peak`` (bytes, PyTorch's caching allocator), and ``kernels``,
  ``kernel_s``, ``copies``, ``copy_s``: the ops the tensor engine's workers ran
  there and the GPU time between CUDA events recorded around each (``timed``).
  Empty where torch is not imported or CUDA not initialised: nothing here imports
  torch or initialises CUDA (``_cuda`` looks at ``sys.modules``).
- ``transfers``: ``count``, ``bytes``, ``seconds``, ``errors`` of the data-plane
  transfers (``RDMABuffer.read_into``/``write_from``) this process started, GPU
  memory or not (``transfer_started``: one closure per transfer, whether
  telemetry is on or not; zero where none ran).

Timed ops also go to the proc's spans ring (the ``spans`` table, the dashboard's
timeline) as ``cuda.kernel`` / ``cuda.copy`` spans, at most ``SPANS_PER_S`` a
second per process (the counters count every op): a span starts when its op was
queued (host clock) and lasts the GPU time its events measured.

The CUDA events are read when they have completed (``Event.query()``, never a
synchronisation): at each ``STATS`` answer and whenever ``_MAX_PENDING`` are waiting.
"""

from __future__ import annotations

import collections
import sys
import threading
import time
from typing import Any

__all__ = [
    "COPY",
    "KERNEL",
    "SPANS_PER_S",
    "observe",
    "op_ended",
    "op_started",
    "reset",
    "transfer_started",
    "transfers",
]

KERNEL = "kernel"
COPY = "copy"
#: GPU op spans kept in the spans ring per second and process (beyond: counted only).
SPANS_PER_S = 200
_MAX_PENDING = 256  # events waiting to be read before the op that records more reads them

_lock = threading.Lock()
# The process's: timed ops whose events were recorded and not read yet:
# (device index, kind, op name, start event, end event, queued at (perf_counter_ns), sink)
_pending: collections.deque[tuple[Any, ...]] = collections.deque()
# per device index: [kernels, kernel seconds, copies, copy seconds]
_ops: dict[int, list[float]] = {}
_free: list[Any] = []  # CUDA timing events read and ready to be recorded again
_span_window = [0, 0]  # the second (perf_counter_ns // 1e9) and the spans kept in it
# data-plane transfers: count, bytes, nanoseconds, errors
_transfers = [0, 0, 0, 0]


def _cuda() -> Any:
    """``torch.cuda`` when torch is imported and CUDA is initialised here, else None.
    (Never imports torch nor initialises CUDA; the tests replace it with a fake.)"""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None) if torch is not None else None
    if cuda is None:
        return None
    try:
        return cuda if cuda.is_initialized() else None
    except Exception:  # a torch without CUDA support, half imported
        return None


# -- op timing (the tensor engine's workers: danaus._tensor.gpu_timing) --------------------


class _Sink:
    """Where a worker's spans go: its runtime's ring, with its actor's name."""

    __slots__ = ("actor", "attrs", "rt")

    def __init__(self, rt: Any, actor: str | None, attrs: dict[str, Any]) -> None:
        self.rt = rt
        self.actor = actor
        self.attrs = attrs


def sink(rt: Any, actor: str | None, attrs: dict[str, Any]) -> _Sink:
    """Where the spans of the ops timed for ``actor`` (``MESH[RANK]``) on ``rt`` go."""
    return _Sink(rt, actor, attrs)


def op_started(cuda: Any) -> Any:
    """Record a timing event on the current CUDA stream before an op; what
    `op_ended()` takes."""
    ev = _free.pop() if _free else cuda.Event(enable_timing=True)
    ev.record()
    return ev


def op_ended(
    cuda: Any, start: Any, device: int, kind: str, name: str, queued_ns: int, out: _Sink | None
) -> None:
    """Record the end event of an op begun with `op_started()` on ``device``
    (``kind`` `KERNEL` or `COPY`); its time is read once it completed."""
    end = _free.pop() if _free else cuda.Event(enable_timing=True)
    end.record()
    with _lock:
        _pending.append((device, kind, name, start, end, queued_ns, out))
        full = len(_pending) >= _MAX_PENDING
    if full:
        _read()


def _read() -> None:
    """Read the events of the ops that have completed (in order; stops at the first
    still running on its stream)."""
    spans: list[tuple[Any, ...]] = []
    with _lock:
        while _pending:
            device, kind, name, start, end, queued, out = _pending[0]
            try:
                if not end.query():
                    break
                ms = start.elapsed_time(end)
            except Exception:  # a device error: the op's time is lost, not the rest
                ms = 0.0
            _pending.popleft()
            _free.extend((start, end))
            acc = _ops.get(device)
            if acc is None:
                acc = _ops[device] = [0, 0.0, 0, 0.0]
            i = 0 if kind == KERNEL else 2
            acc[i] += 1
            acc[i + 1] += ms / 1e3
            if out is not None and _keep_span(queued):
                spans.append((kind, name, device, queued, int(ms * 1e6), out))
    for kind, name, device, queued, ns, out in spans:
        recent = out.rt.observing.recent
        if recent is not None:
            attrs = {**out.attrs, "kind": "gpu", "op": name, "device": f"cuda:{device}"}
            recent.span(f"cuda.{kind}", queued, queued + ns, out.actor, None, None, None, attrs)


def _keep_span(t_ns: int) -> bool:
    second = t_ns // 1_000_000_000
    w = _span_window
    if w[0] != second:
        w[0], w[1] = second, 0
    if w[1] >= SPANS_PER_S:
        return False
    w[1] += 1
    return True


# -- data-plane transfers ------------------------------------------------------------------


def transfer_started(done: Any, nbytes: int) -> None:
    """A data-plane transfer of ``nbytes`` began (``done``, a
    ``concurrent.futures.Future``, completes at its end): counted when it ends."""
    t0 = time.perf_counter_ns()

    def ended(f: Any) -> None:
        failed = f.cancelled() or f.exception() is not None
        with _lock:
            t = _transfers
            t[0] += 1
            t[1] += nbytes
            t[2] += time.perf_counter_ns() - t0
            t[3] += failed

    done.add_done_callback(ended)


def transfers() -> dict[str, Any]:
    """This process's data-plane transfers so far: count, bytes, seconds, errors."""
    with _lock:
        n, b, ns, err = _transfers
    return {"count": n, "bytes": b, "seconds": ns / 1e9, "errors": err}


# -- what a proc answers -------------------------------------------------------------------


def observe() -> dict[str, Any]:
    """This process's GPU activity and transfers (see the module's docstring)."""
    cuda = _cuda()
    devices: list[dict[str, Any]] = []
    if cuda is not None:
        _read()
        with _lock:
            ops = {d: list(v) for d, v in _ops.items()}
        for i in range(cuda.device_count()):
            reserved = cuda.memory_reserved(i)
            if not reserved and i not in ops:
                continue  # a device this process never used: no row
            k, ks, c, cs = ops.get(i, (0, 0.0, 0, 0.0))
            devices.append(
                {
                    "device": f"cuda:{i}",
                    "name": cuda.get_device_name(i),
                    "allocated": cuda.memory_allocated(i),
                    "reserved": reserved,
                    "peak": cuda.max_memory_allocated(i),
                    "kernels": int(k),
                    "kernel_s": ks,
                    "copies": int(c),
                    "copy_s": cs,
                }
            )
    return {"devices": devices, "transfers": transfers()}


def reset() -> None:
    """Forget what was counted (tests)."""
    with _lock:
        _pending.clear()
        _ops.clear()
        _free.clear()
        _transfers[:] = [0, 0, 0, 0]
        _span_window[:] = [0, 0]
