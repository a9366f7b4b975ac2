"""RDMA bandwidth: ``read_into`` / ``write_from`` against a raw in-process copy.

One proc owns a buffer per size; the client reads it into, and writes it
from, memory of its own. The baseline is ``numpy.copyto`` of the same number
of bytes inside the client, measured in the same run: the best a one-copy
transfer could hope for. Every buffer is touched before timing, so page
faults are not counted on either side. Each figure is the median of
``--repeat`` runs; the whole run stops early once ``--budget`` seconds pass.

Two tables: a proc on this host (``process_vm``), then a proc on another
host (``tcp``): a ``ProcessJob`` worker on loopback, which has a host token of
its own, so the bytes go over its authenticated data connection.

Usage::

    python benchmarks/rdma_bench.py               # 1, 16, 128, 512 MiB, both tables
    python benchmarks/rdma_bench.py --smoke       # tiny sizes, a few seconds
    python benchmarks/rdma_bench.py --where tcp   # only the other host
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from danaus.actor import Actor, HostMesh, endpoint, this_host
from danaus.job import ProcessJob
from danaus.rdma import RDMABuffer, get_rdma_backend

MiB = 1 << 20
SIZES = [1 * MiB, 16 * MiB, 128 * MiB, 512 * MiB]
SMOKE_SIZES = [64 << 10, 1 * MiB, 4 * MiB]


class Owner(Actor):
    """Holds one registered buffer per size."""

    def __init__(self) -> None:
        self.held: dict[int, tuple[np.ndarray, RDMABuffer]] = {}

    @endpoint
    def make(self, n: int) -> RDMABuffer:
        data = np.full(n, 7, dtype=np.uint8)  # touched: no page faults during the runs
        buf = RDMABuffer(data)
        self.held[n] = (data, buf)
        return buf

    @endpoint
    def release(self, n: int) -> None:
        _, buf = self.held.pop(n)
        buf.drop().get(timeout=60)

    @endpoint
    def first_and_last(self, n: int) -> tuple[int, int]:
        data = self.held[n][0]
        return int(data[0]), int(data[-1])


def timed(fns: list[Callable[[], object]], repeat: int, deadline: float) -> list[list[float]]:
    """Seconds per run of each of ``fns``: one warm-up each, then up to ``repeat`` rounds.

    The functions take turns within a round, so a noisy neighbour slows all of them
    alike rather than whichever happened to be running.
    """
    for fn in fns:
        fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeat):
        for fn, ts in zip(fns, times, strict=True):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        if time.monotonic() > deadline:
            break
    return times


def rate(nbytes: int, times: list[float]) -> float:
    return nbytes / statistics.median(times) / MiB


def measure(
    owner: Any, n: int, repeat: int, deadline: float, backend: str
) -> tuple[int, float, float, float]:
    """``(n, raw copy, read_into, write_from)`` in MiB/s for ``n`` bytes."""
    buf = owner.make.call_one(n).get(timeout=120)
    assert buf.backend == backend, f"expected the {backend} backend, got {buf.backend}"
    src = np.full(n, 9, dtype=np.uint8)
    dst = np.ones(n, dtype=np.uint8)  # touched
    out = np.ones(n, dtype=np.uint8)  # touched; where read_into lands
    raw, read, write = timed(
        [
            lambda: np.copyto(dst, src),
            lambda: buf.read_into(out).get(timeout=120),
            lambda: buf.write_from(src).get(timeout=120),
        ],
        repeat,
        deadline,
    )
    assert out[0] == out[-1] == 9, "read_into did not deliver the bytes write_from wrote"
    assert owner.first_and_last.call_one(n).get(timeout=60) == (9, 9)
    owner.release.call_one(n).get(timeout=60)
    return n, rate(n, raw), rate(n, read), rate(n, write)


def run_on(
    hosts: HostMesh, backend: str, sizes: list[int], repeat: int, deadline: float, budget: float
) -> list[tuple[int, float, float, float]]:
    procs = hosts.spawn_procs(per_host={"owner": 1})
    owner = procs.spawn("owner", Owner)
    rows = []
    try:
        for n in sizes:
            if time.monotonic() > deadline:
                print(f"(budget of {budget:g} s spent; skipping {n // 1024} KiB and up)")
                break
            rows.append(measure(owner, n, repeat, deadline, backend))
    finally:
        procs.stop().get(timeout=60)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny sizes only (a quick check)")
    ap.add_argument("--repeat", type=int, default=7, help="timed runs per figure (median)")
    ap.add_argument("--budget", type=float, default=120.0, help="stop after this many seconds")
    ap.add_argument(
        "--where",
        choices=["both", "process_vm", "tcp"],
        default="both",
        help="a proc on this host (process_vm), one on another host (tcp), or both",
    )
    args = ap.parse_args(argv)
    sizes = SMOKE_SIZES if args.smoke else SIZES
    repeat = 3 if args.smoke else args.repeat
    deadline = time.monotonic() + args.budget

    print(f"backend: {get_rdma_backend()}; median of up to {repeat} runs; MiB/s")
    if args.where in ("both", "process_vm"):
        print("\nowner on this host (process_vm):")
        rows = run_on(this_host(), "process_vm", sizes, repeat, deadline, args.budget)
        table(rows)
    if args.where in ("both", "tcp"):
        print("\nowner on another host (tcp: a ProcessJob worker on loopback):")
        job = ProcessJob({"hosts": 1})
        job.apply()
        try:
            hosts = job.state().hosts
            rows = run_on(hosts, "tcp", sizes, repeat, deadline, args.budget)
            hosts.shutdown().get(timeout=60)
        finally:
            job.kill()
        table(rows)
    return 0


def table(rows: list[tuple[int, float, float, float]]) -> None:
    head = ("size", "raw copy", "read_into", "ratio", "write_from", "ratio")
    print("{:>10} {:>10} {:>10} {:>6} {:>11} {:>6}".format(*head))
    for n, r_raw, r_read, r_write in rows:
        size = f"{n // MiB} MiB" if n >= MiB else f"{n // 1024} KiB"
        print(
            f"{size:>10} {r_raw:>10.0f} {r_read:>10.0f} {r_read / r_raw:>6.0%} "
            f"{r_write:>11.0f} {r_write / r_raw:>6.0%}"
        )


if __name__ == "__main__":
    sys.exit(main())
