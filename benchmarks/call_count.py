#!/usr/bin/env python3
"""How many Python function calls one warm ``call_one(...).get()`` makes in the caller's thread.

    python benchmarks/call_count.py [--calls 200] [--quiet]

Counts the ``call`` events ``sys.setprofile`` sees in the calling thread (Python
functions only; C functions are not counted, and other threads are not seen) for
each of ``--calls`` round trips to an actor in another process, after a warm-up,
and prints the median and the range. Issue 39 asks for at most 50. Runs the
``danaus`` that ``PYTHONPATH`` (or the environment) gives, so ``scripts/code-metrics
--before REV --calls`` can measure an older tree with this same script.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from types import FrameType
from typing import Any

from danaus.actor import Actor, endpoint, this_host


class Echo(Actor):
    @endpoint
    def echo(self, x: object) -> object:
        return x


def count_one(actor: Any) -> int:
    n = 0

    def prof(frame: FrameType, event: str, arg: object) -> None:
        nonlocal n
        if event == "call":
            n += 1

    sys.setprofile(prof)
    try:
        actor.echo.call_one(7).get(timeout=60)
    finally:
        sys.setprofile(None)
    return n - 1  # the frame of setprofile's own removal is not the call's


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--quiet", action="store_true", help="print only the summary line")
    a = ap.parse_args()
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        actor = procs.spawn("echo", Echo)
        for _ in range(300):
            actor.echo.call_one(7).get(timeout=60)
        counts = sorted(count_one(actor) for _ in range(a.calls))
    finally:
        procs.stop().get(timeout=60)
    if not a.quiet:
        import danaus

        print(f"danaus from {danaus.__file__}")
        print(
            f"distribution (min, p25, p75, max): {counts[0]}, "
            f"{counts[len(counts) // 4]}, {counts[3 * len(counts) // 4]}, {counts[-1]}"
        )
    print(f"calls per call_one: {int(statistics.median(counts))}")


if __name__ == "__main__":
    main()
