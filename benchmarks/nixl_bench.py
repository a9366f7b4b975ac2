"""RDMA backends side by side: the built-in plane against NIXL (UCX), CPU memory.

A proc on this host owns one buffer per size and backend (``rdma_backend`` set
in that proc); the client reads it into, and writes it from, memory of its own.
The floor is ``numpy.copyto`` of the same bytes in the client, in the same run.
Every buffer is touched before timing; each figure is the median of
``--repeat`` runs. Across hosts: ``--where tcp`` uses a worker host on loopback
(a ``ProcessJob``), as ``rdma_bench.py`` does.

Usage::

    .venv/bin/python benchmarks/nixl_bench.py                 # 16 and 256 MiB, this host
    .venv/bin/python benchmarks/nixl_bench.py --sizes 1,16 --repeat 3 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from danaus.actor import Actor, endpoint, this_host
from danaus.config import configure
from danaus.rdma import RDMABuffer

MiB = 1 << 20


class Owner(Actor):
    def __init__(self) -> None:
        self.keep: list[Any] = []

    @endpoint
    def make(self, n: int, backend: str) -> RDMABuffer:
        configure(rdma_backend=backend)
        data = np.ones(n, np.uint8)
        self.keep.append(data)
        return RDMABuffer(data)


def _median_rate(n: int, fn: Callable[[], Any], repeat: int) -> float:
    for _ in range(3):  # warm: connections, metadata, UCX's key caches, page faults
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return n / statistics.median(times) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="16,256", help="MiB, comma-separated")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", default=None, help="also write the rows here")
    args = parser.parse_args()
    sizes = [int(s) * MiB for s in args.sizes.split(",")]
    pm = this_host().spawn_procs(per_host={"x": 1})
    owner = pm.spawn("owner", Owner)
    rows = []
    try:
        for n in sizes:
            src = np.ones(n, np.uint8)
            dst = np.zeros(n, np.uint8)
            floor = _median_rate(n, lambda d=dst, s=src: np.copyto(d, s), args.repeat)
            for backend in ("builtin", "nixl"):
                buf = owner.make.call_one(n, backend).get(timeout=120)
                read = _median_rate(
                    n, lambda b=buf, d=dst: b.read_into(d, timeout=120).get(), args.repeat
                )
                write = _median_rate(
                    n, lambda b=buf, s=src: b.write_from(s, timeout=120).get(), args.repeat
                )
                rows.append(
                    {
                        "MiB": n // MiB,
                        "backend": buf.backend,
                        "read_GBps": round(read, 2),
                        "write_GBps": round(write, 2),
                        "memcpy_GBps": round(floor, 2),
                        "read_vs_memcpy": round(read / floor, 2),
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
                buf.drop().get(timeout=60)
    finally:
        pm.stop().get(timeout=60)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
