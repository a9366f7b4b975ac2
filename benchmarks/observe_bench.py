"""The cost of metrics and tracing, A/B in one client, interleaved block by block.

``run.py``'s ``danaus_nometrics`` / ``danaus_traced`` rows compare separate
worker processes, one after another: on a busy machine the load drifts
between them by more than the few percent being measured. Here the same
procs serve every mode, and the modes alternate in short blocks, so drift
hits them all alike::

    .venv/bin/python benchmarks/observe_bench.py            # ~1 minute
    .venv/bin/python benchmarks/observe_bench.py --blocks 40 --calls 500

Modes: ``off`` (metrics off in the proc, no trace), ``metrics`` (the
default: metrics on, no trace), ``traced`` (metrics on, inside
``danaus.trace``). Metrics are switched in the proc by an endpoint that sets
its runtime's flag, exactly what ``DANAUS_METRICS=0`` sets at start. For
each mode: the median over blocks of the block's median ``call_one`` round
trip, and of the block's throughput (calls issued without waiting, then
awaited); then the ratios to ``off``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from blocks import timed_block

import danaus
from danaus.actor import Actor, endpoint, this_host


class Target(Actor):
    @endpoint
    def ping(self) -> int:
        return 0

    @endpoint
    def set_metrics(self, on: bool) -> None:
        from danaus._runtime.node import this_node

        rt = this_node(start=False).runtime
        assert rt is not None
        rt.observing.metrics = on


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", type=int, default=30, help="blocks per mode")
    ap.add_argument("--calls", type=int, default=300, help="call_one round trips per block")
    ap.add_argument("--burst", type=int, default=1000, help="calls per throughput batch")
    a = ap.parse_args()
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    t = procs.spawn("target", Target)
    for _ in range(500):
        t.ping.call_one().get()
    modes = ["off", "metrics", "traced"]
    lat: dict[str, list[float]] = {m: [] for m in modes}
    rate: dict[str, list[float]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as d:
        for b in range(a.blocks):
            for m in modes[b % 3 :] + modes[: b % 3]:  # rotate the order
                t.set_metrics.call_one(m != "off").get()
                ctx = danaus.trace(os.path.join(d, "t.json")) if m == "traced" else None
                if ctx is not None:
                    ctx.__enter__()
                latency, calls_per_s = timed_block(t, a.calls, a.burst)
                rate[m].append(calls_per_s)
                if ctx is not None:
                    ctx.__exit__(None, None, None)
                lat[m].append(latency)
    procs.stop().get()
    print(f"{a.blocks} blocks per mode, {a.calls} call_one + {a.burst} in flight per block")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    print(f"{'mode':8} {'call_one us':>12} {'x off':>7} {'calls/s':>9} {'x off':>7}")
    for m in modes:
        l_m, r_m = statistics.median(lat[m]), statistics.median(rate[m])
        l_off, r_off = statistics.median(lat["off"]), statistics.median(rate["off"])
        print(f"{m:8} {l_m * 1e6:12.1f} {l_m / l_off:7.3f} {r_m:9.0f} {r_m / r_off:7.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
