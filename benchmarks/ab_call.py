#!/usr/bin/env python3
"""Two danaus trees side by side: the caller's path, measured alternately in one run.

    python benchmarks/ab_call.py --old /path/to/other/checkout [--rounds 5]

Each round runs one fresh client process per tree, old then new (then the
other order next round, so drift on a shared machine falls on both), and
each measures: Python function calls the caller's thread makes for one warm
``call_one`` (counted with ``sys.setprofile``: the ``call_one(...)`` itself,
the ``get()`` of a reply already in, and the round trip), ``call_one``
latency (median of sequential round trips), throughput (10,000 pipelined
calls), ``call()`` plus gather over 4 actors on 4 procs (median), the
client's CPU time per call for each of the three (steadier than wall time on
a loaded machine), and spawn (4 procs and an actor on each, until every actor
answered). Prints the median and the best round per tree, and new/old
ratios. ``--old`` is a checkout of danaus (its ``src`` is imported);
``--new`` defaults to this one. Issue 39's figures in RESULTS.md come from it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


def child(src: str, calls: int) -> dict[str, float]:
    sys.path.insert(0, src)
    from danaus.actor import Actor, endpoint, this_host

    class Echo(Actor):
        @endpoint
        def echo(self, x: object) -> object:
            return x

    host = this_host()
    t0 = time.perf_counter()
    procs = host.spawn_procs(per_host={"gpus": 4})
    four = procs.spawn("echo4", Echo)
    four.echo.call(0).get(timeout=120)
    spawn_ms = 1e3 * (time.perf_counter() - t0)
    one = four.slice(gpus=0)
    for _ in range(500):
        one.echo.call_one(7).get(timeout=60)

    def count(fn: object) -> int:
        n = [0]

        def prof(frame: object, event: str, arg: object) -> None:
            if event == "call":
                n[0] += 1

        sys.setprofile(prof)
        fn()  # type: ignore[operator]
        sys.setprofile(None)
        return n[0] - 1  # the lambda itself

    ep = one.echo
    c_call = min(count(lambda: ep.call_one(7)) for _ in range(5))
    futs = [ep.call_one(7) for _ in range(5)]
    time.sleep(0.2)
    c_get = min(count(lambda f=f: f.get(timeout=60)) for f in futs)
    c_trip = statistics.median(count(lambda: ep.call_one(7).get(timeout=60)) for _ in range(21))

    lat = []
    c0 = time.process_time()
    for _ in range(calls):
        t = time.perf_counter()
        ep.call_one(7).get(timeout=60)
        lat.append(time.perf_counter() - t)
    cpu_one = (time.process_time() - c0) / calls
    m = 10_000
    c0 = time.process_time()
    t = time.perf_counter()
    fs = [ep.call_one(i) for i in range(m)]
    for f in fs:
        f.get(timeout=60)
    thr = m / (time.perf_counter() - t)
    cpu_thr = (time.process_time() - c0) / m
    gat = []
    g = calls // 4
    c0 = time.process_time()
    for _ in range(g):
        t = time.perf_counter()
        four.echo.call(7).get(timeout=60)
        gat.append(time.perf_counter() - t)
    cpu_gat = (time.process_time() - c0) / g
    procs.stop().get(timeout=60)
    return {
        "calls_call_one": c_call,
        "calls_get": c_get,
        "calls_round_trip": c_trip,
        "call_one_us": 1e6 * statistics.median(lat),
        "call_one_cpu_us": 1e6 * cpu_one,
        "throughput_per_s": thr,
        "pipelined_cpu_us": 1e6 * cpu_thr,
        "gather4_us": 1e6 * statistics.median(gat),
        "gather4_cpu_us": 1e6 * cpu_gat,
        "spawn4_ms": spawn_ms,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True, help="a danaus checkout to compare with")
    ap.add_argument("--new", default=str(HERE))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.child, a.calls)))
        return
    trees = {"old": str(Path(a.old) / "src"), "new": str(Path(a.new) / "src")}
    got: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
    for r in range(a.rounds):
        order = ["old", "new"] if r % 2 == 0 else ["new", "old"]
        for which in order:
            out = subprocess.run(
                [sys.executable, __file__, "--old", a.old, "--calls", str(a.calls), "--child",
                 trees[which]],
                capture_output=True, text=True, timeout=900, check=True,
                # PYTHONPATH: the host agent and procs it starts import that tree too
                env={**os.environ, "PYTHONPATH": trees[which]},
            )  # fmt: skip
            got[which].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1} {which}: {got[which][-1]}", flush=True)
    # Medians over rounds, and the best round (least disturbed by other load: on a
    # shared machine the best is the steadier estimate of what the code costs).
    print(f"\n{'figure':<20}{'old med':>10}{'new med':>10}{'ratio':>7}{'old best':>10}"
          f"{'new best':>10}{'ratio':>7}")  # fmt: skip
    for key in got["old"][0]:
        o = statistics.median(x[key] for x in got["old"])
        n = statistics.median(x[key] for x in got["new"])
        pick = max if key == "throughput_per_s" else min
        ob = pick(x[key] for x in got["old"])
        nb = pick(x[key] for x in got["new"])
        print(f"{key:<20}{o:>10.1f}{n:>10.1f}{n / o:>7.2f}{ob:>10.1f}{nb:>10.1f}{nb / ob:>7.2f}")


if __name__ == "__main__":
    main()
