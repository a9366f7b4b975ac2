"""What scraping ``serve_metrics`` as fast as possible costs the client (issue 40, N2).

A client with 4 procs serves its metrics; a scraper (a process of its own) asks
for ``/metrics`` back to back for a few seconds. Measured: the CPU seconds per
wall second of the client process (the HTTP loop, the pool, the I/O thread that
sends the STATS rounds) plus its 4 procs (answering them), and the scrapes
answered, once with ``metrics_min_interval=0``
(every scrape asks every proc, as before issue 40) and once with the default
(1 s: at most one collection a second)::

    .venv/bin/python benchmarks/metrics_scrape_cost.py            # ~15 s
    .venv/bin/python benchmarks/metrics_scrape_cost.py --smoke    # ~5 s
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from danaus import config, telemetry
from danaus.actor import Actor, endpoint, this_host

SCRAPER = """
import sys, time, urllib.request
url, token, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
request = urllib.request.Request(url, headers={"Authorization": "Bearer " + token})
n, end = 0, time.monotonic() + seconds
while time.monotonic() < end:
    with urllib.request.urlopen(request, timeout=30) as r:
        r.read()
    n += 1
print(n)
"""


class Pid(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()


def cpu_seconds(pids: list[int]) -> float:
    """utime + stime of the processes ``pids`` (this one included by the caller)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def scrape_for(m: telemetry.MetricsServer, pids: list[int], seconds: float) -> tuple[int, float]:
    """Scrapes answered and the CPU seconds per wall second of ``pids``."""
    t0, c0 = time.monotonic(), cpu_seconds(pids)
    out = subprocess.run(
        [sys.executable, "-c", SCRAPER, m.url, m.token, str(seconds)],
        capture_output=True,
        text=True,
        check=True,
    )
    wall, cpu = time.monotonic() - t0, cpu_seconds(pids) - c0
    return int(out.stdout), cpu / wall


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true")
    seconds = 2.0 if ap.parse_args().smoke else 6.0
    procs = this_host().spawn_procs(per_host={"gpus": 4})
    pids = [os.getpid(), *procs.spawn("pid", Pid).pid.call().get().values()]
    m = telemetry.serve_metrics(token="bench")
    try:
        rows = []
        for interval in (0.0, 1.0):
            with config.configured(metrics_min_interval=interval):
                n, cpu = scrape_for(m, pids, seconds)
            rows.append((interval, n, cpu))
            print(
                f"metrics_min_interval={interval:g}s: {n} scrapes in {seconds:g} s, "
                f"client and procs: {cpu:.0%} of a core",
                flush=True,
            )
        print(f"ratio of CPU (interval 0 / 1 s): {rows[0][2] / max(rows[1][2], 1e-9):.1f}x")
    finally:
        m.stop()
        procs.stop().get()


if __name__ == "__main__":
    main()
