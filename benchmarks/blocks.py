"""One timed block of the A/B overhead benchmarks (observe_bench, telemetry_bench).

A block times ``calls`` sequential ``call_one`` round trips and then ``burst`` calls in
flight at once, on an actor with a ``ping`` endpoint; the scripts alternate their
modes block by block so a busy machine weighs on each alike.
"""

from __future__ import annotations

import statistics
import time
from typing import Any


def timed_block(actor: Any, calls: int, burst: int) -> tuple[float, float]:
    """``(median call_one latency in s, calls/s with burst in flight)``."""
    samples = []
    for _ in range(calls):
        t0 = time.perf_counter()
        actor.ping.call_one().get()
        samples.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    futs = [actor.ping.call_one() for _ in range(burst)]
    for f in futs:
        f.get()
    return statistics.median(samples), burst / (time.perf_counter() - t0)
