#!/usr/bin/env python3
"""Where a danaus call's time goes: CPU per call in the client and in the actor's proc.

    python benchmarks/profile_call.py [--calls 5000] [--profile]

Runs sequential ``call_one`` round trips and a 10,000-call pipelined batch to one
actor in another process, and prints wall time and CPU time per call for both
processes (from ``/proc/<pid>/stat``), plus the thread counts, and the Python
function calls the caller's thread makes for one warm ``call_one`` (counted
with ``sys.setprofile``: the ``call_one(...)``, the ``get()`` of a reply
already in, and the round trip; issue 39's goal; ``benchmarks/ab_call.py``
prints them for two trees side by side). ``--profile`` adds the client's
cProfile top functions for the sequential calls. Not part of ``run.py``; a
diagnostic for the numbers in NOTES.md.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from danaus.actor import Actor, endpoint, this_host


class Echo(Actor):
    @endpoint
    def echo(self, x: object) -> object:
        return x

    @endpoint
    def pid(self) -> int:
        return os.getpid()


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def python_calls(fn: object) -> int:
    """Python functions called (``sys.setprofile``'s "call" events) while ``fn()`` runs."""
    n = [0]

    def prof(frame: object, event: str, arg: object) -> None:
        if event == "call":
            n[0] += 1

    sys.setprofile(prof)
    fn()  # type: ignore[operator]
    sys.setprofile(None)
    return n[0] - 1  # fn itself


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=5000)
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    actor = procs.spawn("echo", Echo)
    rpid = actor.pid.call_one().get(timeout=60)
    for _ in range(500):
        actor.echo.call_one(7).get(timeout=60)

    ep = actor.echo
    sent = min(python_calls(lambda: ep.call_one(7)) for _ in range(5))
    futs = [ep.call_one(7) for _ in range(5)]
    time.sleep(0.2)
    got = min(python_calls(lambda f=f: f.get(timeout=60)) for f in futs)
    trip = sorted(python_calls(lambda: ep.call_one(7).get(timeout=60)) for _ in range(21))[10]
    print(
        f"Python calls in the caller's thread: call_one(...) {sent}, get() of a reply "
        f"already in {got}, round trip {trip} (median of 21)"
    )

    n = a.calls
    c0, r0, t0 = time.process_time(), cpu_s(rpid), time.perf_counter()
    for _ in range(n):
        actor.echo.call_one(7).get(timeout=60)
    c1, r1, t1 = time.process_time(), cpu_s(rpid), time.perf_counter()
    print(
        f"call_one: wall {1e6 * (t1 - t0) / n:.1f} us/call; CPU client "
        f"{1e6 * (c1 - c0) / n:.1f} us/call, actor proc {1e6 * (r1 - r0) / n:.1f} us/call; "
        f"threads client {threads(os.getpid())}, actor proc {threads(rpid)}"
    )

    m = 10_000
    c0, r0, t0 = time.process_time(), cpu_s(rpid), time.perf_counter()
    futs = [actor.echo.call_one(i) for i in range(m)]
    t_issued = time.perf_counter()
    for f in futs:
        f.get(timeout=60)
    c1, r1, t1 = time.process_time(), cpu_s(rpid), time.perf_counter()
    print(
        f"throughput: {m / (t1 - t0):,.0f} calls/s; issuing {1e6 * (t_issued - t0) / m:.1f} "
        f"us/call; CPU client {1e6 * (c1 - c0) / m:.1f} us/call, actor proc "
        f"{1e6 * (r1 - r0) / m:.1f} us/call"
    )

    if a.profile:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(min(n, 2000)):
            actor.echo.call_one(7).get(timeout=60)
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)
    procs.stop().get(timeout=30)


if __name__ == "__main__":
    main()
