#!/usr/bin/env python3
"""Check danaus.timer's CUDA-event path on a machine with a GPU; prints what it measured.

    PYTHONPATH=src python scripts/gpu-check-timer.py            # local + on a one-proc mesh
    PYTHONPATH=src python scripts/gpu-check-timer.py --local    # local only

Local: sections timed with CUDA events (count, nesting, a CPU section beside
them, the reading waits for the GPU) against perf_counter around a
synchronized matmul. Mesh: the flow of Monarch's timer/example_monarch.py on
one proc with CUDA tensors, the timer's functions run there with ``remote``.
Exits 1 if a check fails, 2 without CUDA.
"""

from __future__ import annotations

import sys
import time

import torch


def check(cond: bool, what: str, failures: list[str]) -> None:
    print(("ok    " if cond else "FAIL  ") + what)
    if not cond:
        failures.append(what)


def local(failures: list[str]) -> None:
    from danaus.timer import ExecutionTimer

    timer = ExecutionTimer()
    a = torch.randn(4000, 4000, device="cuda")
    b = torch.randn(4000, 4000, device="cuda")
    torch.matmul(a, b)
    torch.cuda.synchronize()
    host = []
    for _ in range(5):
        t0 = time.perf_counter()
        torch.matmul(a, b)
        torch.cuda.synchronize()
        host.append((time.perf_counter() - t0) * 1000)
    with timer.time("loop"):
        for _ in range(5):
            with timer.time("matmul"):
                torch.matmul(a, b)
    with timer.time("host", use_cpu=True):
        pass
    stop_returned = time.perf_counter()
    stats = timer.summary()  # waits for the end events
    waited_ms = (time.perf_counter() - stop_returned) * 1000
    timer.print_summary()
    print(f"perf_counter around a synchronized matmul: mean {sum(host) / len(host):.3f} ms")
    print(f"summary() waited {waited_ms:.3f} ms for the GPU")
    check(stats["matmul"]["count"] == 5, "5 matmul sections", failures)
    check(stats["loop"]["count"] == 1 and stats["host"]["count"] == 1, "loop, host once", failures)
    check(stats["matmul"]["min_ms"] > 0, "CUDA sections measure > 0 ms", failures)
    check(
        stats["loop"]["total_ms"] >= stats["matmul"]["total_ms"] * 0.99,
        "the enclosing section measures at least its parts",
        failures,
    )
    mean_host = sum(host) / len(host)
    check(
        0.2 * mean_host < stats["matmul"]["mean_ms"] < 5 * mean_host,
        "CUDA mean within 5x of the host-synchronized mean",
        failures,
    )
    check(timer.get_latest_measurement("matmul") > 0, "the latest CUDA section reads", failures)


def mesh(failures: list[str]) -> None:
    import danaus
    from danaus.actor import this_host

    path = "danaus.timer.remote_execution_timer"
    start = danaus.remote(f"{path}.execution_timer_start", propagate="inspect")
    stop = danaus.remote(f"{path}.execution_timer_stop", propagate="inspect")
    average = danaus.remote(
        f"{path}.get_execution_timer_average_ms",
        propagate=lambda: torch.tensor(0.0, dtype=torch.float64),
    )
    perf = danaus.remote(
        f"{path}.get_time_perfcounter", propagate=lambda: torch.tensor(0.0, dtype=torch.float64)
    )
    summary = danaus.remote(f"{path}.get_execution_timer_summary", propagate="inspect")
    procs = this_host().spawn_procs(per_host={"hosts": 1, "gpus": 1})
    try:
        with procs.activate():
            n = 5
            a = torch.randn(1000, 1000, device="cuda")
            b = torch.randn(1000, 1000, device="cuda")
            torch.matmul(a, b)
            total_dt = torch.zeros(1, dtype=torch.float64)
            for _ in range(n):
                t0 = perf()
                torch.matmul(a, b)
                total_dt += perf() - t0
            for _ in range(n):
                start()
                torch.matmul(a, b)
                stop()
            avg = danaus.inspect(average()).item()
            dt = danaus.inspect(total_dt).item()
            stats = summary.call_one().get(timeout=60)
        print(f"mesh: average time w/ perfcounter: {dt / n * 1000:.4f} ms")
        print(f"mesh: average time w/ ExecutionTimer: {avg:.4f} ms; summary {stats}")
        check(stats["default"]["count"] == n, f"mesh: {n} sections on the worker", failures)
        check(avg > 0, "mesh: the worker's CUDA average is > 0", failures)
    finally:
        procs.stop().get(timeout=60)


def main() -> int:
    if not torch.cuda.is_available():
        print("CUDA is not available: nothing to check here")
        return 2
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    failures: list[str] = []
    local(failures)
    if "--local" not in sys.argv:
        try:
            mesh(failures)
        except Exception as e:  # report and go on: the local checks stand on their own
            check(False, f"mesh flow raised {type(e).__name__}: {e}", failures)
    print("all checks passed" if not failures else f"{len(failures)} check(s) failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
