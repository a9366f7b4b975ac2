"""Helpers shared by the per-system workers (standard library only).

A worker is run as ``python systems/<system>_bench.py --workload NAME --smoke|--full``
under the system's own interpreter. It prints exactly one line starting with
``BENCH_RESULT `` followed by a JSON object::

    {"system": ..., "workload": ..., "samples": [...], "work": ..., "extra": {...},
     "error": null | "text"}

Anything else a library prints (logs, banners) is ignored by the driver.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # benchmarks/, for workloads.py

from workloads import BY_NAME, MiB, Params, Workload  # noqa: E402

MARKER = "BENCH_RESULT "

__all__ = [
    "MARKER",
    "MiB",
    "Params",
    "Workload",
    "emit",
    "measure",
    "measure_each",
    "parse_args",
    "proc_memory",
    "run_worker",
]


def parse_args(system: str) -> tuple[Workload, Params, bool]:
    ap = argparse.ArgumentParser(description=f"{system} benchmark worker")
    ap.add_argument("--workload", required=True, choices=sorted(BY_NAME))
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--smoke", action="store_true", help="tiny sizes, few samples")
    mode.add_argument("--full", action="store_true", help="the real sizes (default)")
    a = ap.parse_args()
    wl = BY_NAME[a.workload]
    return wl, wl.params(a.smoke), bool(a.smoke)


def measure(
    fn: Callable[[], Any],
    p: Params,
    *,
    warmup: int | None = None,
    samples: int | None = None,
) -> list[float]:
    """Run ``fn`` ``warmup`` times untimed, then time it up to ``samples`` times.

    Stops early once ``p.budget_s`` has passed (after at least one sample).
    """
    for _ in range(p.warmup if warmup is None else warmup):
        fn()
    n = p.samples if samples is None else samples
    out: list[float] = []
    clock = time.perf_counter
    start = clock()
    for _ in range(n):
        t0 = clock()
        fn()
        out.append(clock() - t0)
        if clock() - start > p.budget_s:
            break
    return out


def measure_each(fn: Callable[[], float], p: Params, *, min_samples: int = 1) -> list[float]:
    """Like :func:`measure`, for iterations that time themselves (``fn`` returns seconds)."""
    for _ in range(p.warmup):
        fn()
    out: list[float] = []
    start = time.perf_counter()
    for _ in range(max(p.samples, min_samples)):
        out.append(fn())
        if time.perf_counter() - start > p.budget_s and len(out) >= min_samples:
            break
    return out


def proc_memory(pid: int) -> dict[str, int]:
    """VmRSS (and PSS where readable) of a process, in bytes."""
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line.split(":")[0]] = int(line.split()[1]) * 1024
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    out["Pss"] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return out


def emit(
    system: str,
    wl: Workload,
    samples: list[float],
    work: float | None = None,
    extra: dict[str, Any] | None = None,
    error: str | None = None,
) -> None:
    rec = {
        "system": system,
        "workload": wl.name,
        "kind": wl.kind,
        "samples": samples,
        "work": work,
        "extra": extra or {},
        "error": error,
    }
    sys.stdout.write(MARKER + json.dumps(rec) + "\n")
    sys.stdout.flush()


def run_worker(
    system: str,
    impls: dict[
        str, Callable[[Workload, Params, dict[str, Any]], tuple[list[float], float | None]]
    ],
    setup: Callable[[], Any] | None = None,
    teardown: Callable[[], Any] | None = None,
) -> None:
    """Parse arguments, run one workload, print its result line, then tear down.

    ``impls[name](workload, params, extra)`` returns ``(samples, work)`` and may
    add notes to ``extra``. The result is printed before teardown so a system
    that hangs while shutting down still reports its numbers.
    """
    wl, p, smoke = parse_args(system)
    extra: dict[str, Any] = {"smoke": smoke, "pid": os.getpid()}
    torch_first = sys.modules.get("_torch_first")  # the floor has no client to import it
    if wl.torch and torch_first is not None:
        extra["client_torch"] = getattr(torch_first, "STATE", None) or "not imported"
    try:
        if setup is not None:
            setup()
        samples, work = impls[wl.name](wl, p, extra)
    except BaseException as e:  # report anything, including SystemExit
        emit(system, wl, [], None, extra, f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
        _teardown(teardown)
        os._exit(1)
    emit(system, wl, samples, work, extra)
    _teardown(teardown)


def _teardown(teardown: Callable[[], Any] | None) -> None:
    if teardown is None:
        return
    try:
        teardown()
    except BaseException as e:
        sys.stderr.write(f"teardown failed: {type(e).__name__}: {e}\n")
