"""Throughput of log forwarding: 8 procs print as fast as they can; what does capture cost?

    .venv/bin/python benchmarks/logs_bench.py [MB]     # default 200 MB in all

Three runs on the same 8 procs, in the same process:

- ``devnull``: the procs print to ``/dev/null``, line-buffered like their
  captured stdout (one ``write`` per line): the cost of printing alone, the
  baseline;
- ``aggregated``: to their real stdout, captured by the host agent, written to
  the per-proc files and forwarded to this client, which aggregates (the
  default, ``aggregate_window_sec=3``) and prints a handful of lines;
- ``printed``: the same, every line printed (``aggregate_window_sec=None``) to
  a client stdout that discards them.

Each time is from the first call until the client has received every line (a
flush barrier); lines dropped because the client fell behind are counted.
Prints a table and writes ``benchmarks/results/logs-<UTC timestamp>.json``.
"""

from __future__ import annotations

import io
import json
import os
import sys
import threading
import time
from typing import Any

from danaus._runtime.logs import process as logs
from danaus.actor import Actor, endpoint, this_host

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Printer(Actor):
    @endpoint
    def run(self, nbytes: int, to_devnull: bool) -> int:
        line = "0123456789 " * 8 + "\n"
        n = nbytes // len(line)
        # /dev/null line-buffered, like the captured stdout: one write per line in both.
        out = open(os.devnull, "w", buffering=1) if to_devnull else sys.stdout  # noqa: SIM115
        write = out.write
        for _ in range(n):
            write(line)
        out.flush()
        if to_devnull:
            out.close()
        return n


def _discard() -> Any:
    class Sink(io.TextIOBase):
        def write(self, s: str) -> int:
            return len(s)

    return Sink()


def main() -> None:
    mb = float(sys.argv[1]) if len(sys.argv) > 1 else 200.0
    nbytes = int(mb * (1 << 20))
    procs = this_host().spawn_procs(per_host={"gpus": 8}, name="bench")
    printers = procs.spawn("printers", Printer)
    printers.initialized.get(timeout=60)
    results: dict[str, Any] = {"mb": mb, "procs": 8}
    real = sys.stdout
    for name, devnull, window in (
        ("devnull", True, 3),
        ("aggregated", False, 3),
        ("printed", False, None),
    ):
        procs.logging_option(aggregate_window_sec=window)
        before = logs.statistics()
        sys.stdout = _discard()
        try:
            t0 = time.perf_counter()
            lines = sum(printers.run.call(nbytes // 8, devnull).get(timeout=600).values())
            printed = time.perf_counter() - t0  # every proc has written its last line
            logs.flush(list(procs._procs), 600).result(600)
            dt = time.perf_counter() - t0
        finally:
            sys.stdout = real
        after = logs.statistics()
        results[name] = {
            "seconds": round(dt, 3),
            "procs_done_s": round(printed, 3),
            "MB_per_s": round(mb / dt, 1),
            "lines": lines,
            "received": after.lines - before.lines,
            "dropped": after.dropped - before.dropped,
        }
    base = results["devnull"]["seconds"]
    for name in ("aggregated", "printed"):
        results[name]["vs_devnull"] = round(results[name]["seconds"] / base, 2)
    procs.stop().get(timeout=60)
    print(f"{mb:.0f} MB from 8 procs ({os.cpu_count()} CPUs)")
    print(
        f"{'run':<12}{'s':>8}{'procs s':>9}{'MB/s':>8}{'received':>11}{'dropped':>10}"
        f"{'x devnull':>11}"
    )
    for name in ("devnull", "aggregated", "printed"):
        r = results[name]
        print(
            f"{name:<12}{r['seconds']:>8}{r['procs_done_s']:>9}{r['MB_per_s']:>8}{r['received']:>11}{r['dropped']:>10}"
            f"{r.get('vs_devnull', 1.0):>11}"
        )
    os.makedirs(os.path.join(ROOT, "benchmarks", "results"), exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = os.path.join(ROOT, "benchmarks", "results", f"logs-{stamp}.json")
    with open(path, "w") as f:
        json.dump(results, f, indent=1)
    print(f"written to {path}")


if __name__ == "__main__":
    threading.current_thread().name = "bench"
    main()
