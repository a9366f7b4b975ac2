"""PyTorch Monarch's ``RDMABuffer``: ``read_into`` / ``write_from`` against a raw copy.

Run by ``benchmarks/rdma_bench.py`` under ``benchmarks/.envs/monarch/bin/python``
(torchmonarch 0.7). One proc holds an actor owning a ``memoryview`` buffer per
size; the client reads it into, and writes it from, numpy arrays of its own;
``numpy.copyto`` of the same bytes in this process is the baseline. Without
ibverbs hardware Monarch's TCP fallback is used (enabled here with
``monarch.configure(rdma_allow_tcp_fallback=True)``).

Prints one ``RDMA_ROW {json}`` line per size as soon as it is measured (so a
run killed for time still reports what it got), ``RDMA_INFO {json}`` with the
backend first, and ``RDMA_ERROR text`` if something fails. Usage::

    python monarch_rdma_bench.py --sizes 1048576,16777216 --repeat 5 --budget 60
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
import warnings

import numpy as np

MiB = 1 << 20


def timed(buf, src: np.ndarray, out: np.ndarray, repeat: int, deadline: float) -> list[list[float]]:
    """Seconds per run of raw copy, read_into, write_from: one warm-up each, then
    up to ``repeat`` interleaved rounds (a noisy neighbour slows all three alike)."""
    dst = np.ones(len(src), dtype=np.uint8)  # touched
    fns = [
        lambda: np.copyto(dst, src),
        lambda: buf.read_into(memoryview(out), timeout=120).get(timeout=130),
        lambda: buf.write_from(memoryview(src), timeout=120).get(timeout=130),
    ]
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", required=True, help="comma-separated byte counts")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--budget", type=float, default=60.0)
    a = ap.parse_args()
    sizes = [int(s) for s in a.sizes.split(",")]
    deadline = time.monotonic() + a.budget

    try:
        import monarch
        from monarch.actor import Actor, endpoint, this_host
        from monarch.rdma import RDMABuffer, RDMATcpFallbackWarning, get_rdma_backend

        warnings.simplefilter("ignore", RDMATcpFallbackWarning)
        monarch.configure(rdma_allow_tcp_fallback=True)
    except Exception as e:
        print(f"RDMA_ERROR import/configure failed: {type(e).__name__}: {e}", flush=True)
        return 1

    class Owner(Actor):
        def __init__(self) -> None:
            self.held: dict[int, tuple[np.ndarray, RDMABuffer]] = {}

        @endpoint
        def make(self, n: int) -> RDMABuffer:
            warnings.simplefilter("ignore", RDMATcpFallbackWarning)
            data = np.full(n, 7, dtype=np.uint8)  # touched
            buf = RDMABuffer(memoryview(data))
            self.held[n] = (data, buf)
            return buf

        @endpoint
        def release(self, n: int) -> None:
            self.held.pop(n, None)

        @endpoint
        def first_and_last(self, n: int) -> tuple[int, int]:
            data = self.held[n][0]
            return int(data[0]), int(data[-1])

    try:
        print(f"RDMA_INFO {json.dumps({'backend': get_rdma_backend()})}", flush=True)
        procs = this_host().spawn_procs(per_host={"gpus": 1})
        owner = procs.spawn("owner", Owner)
        for n in sizes:
            if time.monotonic() > deadline:
                print(f"RDMA_ERROR budget of {a.budget:g} s spent before {n} bytes", flush=True)
                break
            buf = owner.make.call_one(n).get(timeout=120)
            src = np.full(n, 9, dtype=np.uint8)
            out = np.ones(n, dtype=np.uint8)  # touched; where read_into lands
            times = timed(buf, src, out, a.repeat, deadline)
            ok = bool(out[0] == out[-1] == 9)
            ok = ok and tuple(owner.first_and_last.call_one(n).get(timeout=60)) == (9, 9)
            owner.release.call_one(n).get(timeout=60)
            raw, read, write = (n / statistics.median(ts) / MiB for ts in times)
            row = {"n": n, "raw": raw, "read": read, "write": write, "verified": ok}
            print(f"RDMA_ROW {json.dumps(row)}", flush=True)
    except Exception as e:
        text = f"{type(e).__name__}: {e}".replace("\n", " ")[:500]
        print(f"RDMA_ERROR {text}", flush=True)
        traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
