#!/usr/bin/env python3
"""The cast tree at 512, 4,096 and 8,192 ranks: the caller's work and latency per message.

    python benchmarks/tree_bench.py                  # 512, 4096, 8192 ranks, tree and direct
    python benchmarks/tree_bench.py --sizes 512 --rounds 3 --no-direct   # quick look

The meshes are simulated (``danaus._actor.tools.simulated.SimulatedMesh``): every
proc is a real runtime over the in-process transport, all on one thread, so
the caller's side (this script's main thread and its I/O thread) is exactly
what it would be with real procs. For each size it measures, per
``broadcast()`` and per ``call().get()`` (call-gather):

- the caller's CPU time (its main thread plus its I/O thread, from the
  threads' own CPU clocks: the simulated procs' thread is not counted);
- the frames the caller sent and received;
- the tree's depth in hops (the longest path a message takes), and the wall
  time until the last rank had the broadcast. In the simulation every proc
  shares one thread, so that time is the sum of all procs' work (it grows
  with N); with real procs working in parallel a broadcast's latency is
  ``depth`` hops, which grows with log N.

The same is measured with the tree switched off (``tree_min_ranks`` above
the size: one frame per actor from the caller) for comparison, and the
growth of each figure with N is fitted as ``N^b`` (least squares on logs).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import danaus.config
from danaus._actor.tools.simulated import SimulatedMesh
from danaus._mesh.tree import depth
from danaus._runtime.node import this_node
from danaus.actor import Actor, endpoint

HERE = Path(__file__).resolve().parent


class Echo(Actor):
    def __init__(self) -> None:
        self.seen = -1
        self.latency = 0.0

    @endpoint
    def ping(self, i: int, t0: float) -> None:
        self.seen = i
        self.latency = time.perf_counter() - t0

    @endpoint
    def value(self, i: int) -> int:
        return i


def _io_thread() -> threading.Thread:
    this_node()  # starts the client's node and its I/O thread
    for t in threading.enumerate():
        if t.name == "danaus-io":
            return t
    raise RuntimeError("no danaus-io thread in this client")


def _cpu(thread: threading.Thread) -> float:
    assert thread.ident is not None
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


class CallerMeter:
    """CPU of the caller's threads and frames through its in-process connections."""

    def __init__(self) -> None:
        self.rt = this_node().runtime
        self.io = _io_thread()
        self.main = threading.current_thread()

    def frames(self) -> tuple[int, int]:
        peers = list(self.rt.peers.table.values())
        sent = sum(getattr(p.conn, "frames_sent", 0) for p in peers)
        got = sum(getattr(c, "frames_received", 0) for c in list(self.rt.links.incoming))
        got += sum(getattr(p.conn, "frames_received", 0) for p in peers)
        return sent, got

    def snapshot(self) -> tuple[float, float, int, int]:
        sent, got = self.frames()
        return time.thread_time(), _cpu(self.io), sent, got


def _wait_all(sim: SimulatedMesh, i: int, timeout: float = 600.0) -> float:
    """Block until every rank has broadcast ``i``; the slowest rank's latency."""
    done = threading.Event()
    out: list[float] = []

    def check() -> None:
        if all(c.instance.seen >= i for c in sim.cells):
            out.append(max(c.instance.latency for c in sim.cells))
            done.set()
        else:
            sim.loop.call_later(0.002, check)

    sim.loop.call_soon_threadsafe(check)
    if not done.wait(timeout):
        raise TimeoutError(f"broadcast {i} did not reach every rank in {timeout} s")
    return out[0]


def measure(n: int, rounds: int, tree: bool, fanout: int) -> dict[str, Any]:
    danaus.config.configure(tree_fanout=fanout, tree_min_ranks=64 if tree else n + 1)
    meter = CallerMeter()
    with SimulatedMesh(Echo, {"hosts": n // 16, "gpus": 16}, name=f"echo{n}") as sim:
        mesh = sim.mesh
        mesh.value.call(0).get(timeout=600)  # connects, and installs the tree's routes
        bc: dict[str, list[float]] = {"cpu": [], "sent": [], "got": [], "wall": []}
        for i in range(rounds):
            c0, io0, s0, g0 = meter.snapshot()
            mesh.ping.broadcast(i, time.perf_counter())
            c1, io1, s1, g1 = meter.snapshot()
            bc["wall"].append(_wait_all(sim, i))
            bc["cpu"].append((c1 - c0) + (io1 - io0))
            bc["sent"].append(s1 - s0)
            bc["got"].append(g1 - g0)
        ga: dict[str, list[float]] = {"cpu": [], "sent": [], "got": [], "wall": []}
        for i in range(rounds):
            c0, io0, s0, g0 = meter.snapshot()
            t0 = time.perf_counter()
            values = mesh.value.call(i).get(timeout=600)
            wall = time.perf_counter() - t0
            time.sleep(0.01)  # let the I/O thread finish its bookkeeping (closing the port)
            c1, io1, s1, g1 = meter.snapshot()
            assert len(values) == n
            ga["wall"].append(wall)
            ga["cpu"].append((c1 - c0) + (io1 - io0))
            ga["sent"].append(s1 - s0)
            ga["got"].append(g1 - g0)
    return {
        "n": n,
        "tree": tree,
        "fanout": fanout,
        "depth": depth(n, fanout) if tree else 1,
        "broadcast": {k: statistics.median(v) for k, v in bc.items()},
        "gather": {k: statistics.median(v) for k, v in ga.items()},
    }


def fit(xs: list[float], ys: list[float]) -> float:
    """The exponent b of y ~ N^b (least squares on logs)."""
    lx = [math.log(x) for x in xs]
    ly = [math.log(max(y, 1e-9)) for y in ys]
    mx, my = statistics.fmean(lx), statistics.fmean(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly, strict=True)) / sum(
        (a - mx) ** 2 for a in lx
    )


def render(rows: list[dict[str, Any]]) -> str:
    out = [
        "mode    ranks  depth | broadcast: caller CPU   sent  recv  last rank (sim) | "
        "call-gather: caller CPU   sent  recv  wall (sim)",
    ]
    for r in rows:
        b, g = r["broadcast"], r["gather"]
        out.append(
            f"{'tree' if r['tree'] else 'direct':<6} {r['n']:>6} {r['depth']:>6} | "
            f"{b['cpu'] * 1e3:>17.3f} ms {b['sent']:>6.0f} {b['got']:>5.0f} "
            f"{b['wall'] * 1e3:>12.1f} ms | "
            f"{g['cpu'] * 1e3:>19.3f} ms {g['sent']:>6.0f} {g['got']:>5.0f} "
            f"{g['wall'] * 1e3:>8.1f} ms"
        )
    for mode in (True, False):
        sel = [r for r in rows if r["tree"] is mode]
        if len(sel) < 2:
            continue
        ns = [r["n"] for r in sel]
        parts = []
        for op in ("broadcast", "gather"):
            for k in ("cpu", "sent", "got"):
                parts.append(f"{op} {k} ~ N^{fit(ns, [r[op][k] for r in sel]):.2f}")
        out.append(f"fitted growth ({'tree' if mode else 'direct'}): " + ", ".join(parts))
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="512,4096,8192")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--fanout", type=int, default=16)
    ap.add_argument("--no-direct", action="store_true", help="skip the tree-off comparison")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    for tree in (True, False) if not args.no_direct else (True,):
        for n in sizes:
            rows.append(measure(n, args.rounds, tree, args.fanout))
            print(render(rows[-1:]).splitlines()[-1], flush=True)
    print()
    print(f"fan-out {args.fanout}, {args.rounds} rounds, medians; load average {_load()}")
    print(render(rows))
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2))


def _load() -> str:
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "?"


if __name__ == "__main__":
    main()
