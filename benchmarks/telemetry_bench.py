"""The cost of telemetry (issue 29), A/B in one client, interleaved block by block.

The client turns telemetry on (as ``JobTrait.enable_telemetry`` does), with
every process exporting over OTLP/HTTP to a receiver this script runs in a
process of its own (it parses nothing, it answers 200), so spans really are
batched, encoded and posted. The same procs serve every mode, and the modes
alternate in short blocks, so load drifting on a busy machine hits them alike::

    .venv/bin/python benchmarks/telemetry_bench.py            # ~1 minute
    .venv/bin/python benchmarks/telemetry_bench.py --blocks 40 --calls 500

Modes:

- ``off``: telemetry off in the client (what every program gets by default; the
  send path reads one module attribute);
- ``on``: telemetry on, calls made outside any span (the header carries None; the
  client looks up the current span on each send);
- ``in_span``: telemetry on and every call made inside a client span, so each
  one carries its context and the endpoint runs in a span of its own, which the
  proc exports: the cost of tracing every call. Sampling is OpenTelemetry's
  ``parentbased_traceidratio`` at ``--ratio`` (1.0 by default: every call gets a
  span, which is in the spans table and exported).

After each ``in_span`` block, every process exports what it still holds before
the next block starts (untimed). ``--control`` adds ``off_again``, the ``off``
mode measured twice: how far apart two identical modes come out is the noise
of the run. For each mode: the median over blocks of the block's median
``call_one`` round trip, and of the block's throughput (``--burst`` calls issued without waiting,
then awaited), and of the CPU time the client and the proc spent per call (their
exports after the block included: a measure that load on a shared machine blurs
less); then the ratios to ``off``. The goals: ``on`` within 1.10x of
``off`` on ``call_one`` and 0.90x on throughput (issue 29); ``in_span`` within 1.5x
on ``call_one`` and 0.85x on throughput (issue 41). The last line says how many
endpoint spans the proc recorded, exported and dropped.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from blocks import timed_block

from danaus._actor.core import telemetry
from danaus.actor import Actor, endpoint, span, this_host


class Target(Actor):
    @endpoint
    def ping(self) -> int:
        return 0

    @endpoint
    def flush(self) -> None:
        _flush()

    @endpoint
    def cpu(self) -> float:
        return time.process_time()  # every thread of the proc: its batch export too

    @endpoint
    def exports(self) -> dict[str, object]:
        e = telemetry._exports
        return {"mode": e.mode, "exported": e.exported, "dropped": e.dropped, "failed": e.failed}


def _flush() -> None:
    """Export what this process's spans still wait for, so that a block's export
    does not run into the next block's measurement."""
    from opentelemetry import trace

    trace.get_tracer_provider().force_flush()  # type: ignore[attr-defined]


_RECEIVER = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keeps connections open, as a collector does
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *a):
        pass
s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", type=int, default=30, help="blocks per mode")
    ap.add_argument("--calls", type=int, default=300, help="call_one round trips per block")
    ap.add_argument("--burst", type=int, default=1000, help="calls per throughput batch")
    ap.add_argument("--control", action="store_true", help="also measure off twice (noise)")
    ap.add_argument("--ratio", type=float, default=1.0, help="the trace sampling ratio")
    a = ap.parse_args()

    receiver = subprocess.Popen(
        [sys.executable, "-c", _RECEIVER], stdout=subprocess.PIPE, text=True
    )
    assert receiver.stdout is not None
    port = int(receiver.stdout.readline())
    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{port}"
    os.environ["OTEL_SERVICE_NAME"] = "telemetry_bench"
    os.environ["OTEL_TRACES_SAMPLER"] = "parentbased_traceidratio"
    os.environ["OTEL_TRACES_SAMPLER_ARG"] = str(a.ratio)

    telemetry.enable()  # what state() does after job.enable_telemetry()
    try:
        procs = this_host().spawn_procs(per_host={"gpus": 1})
        t = procs.spawn("target", Target)
        for _ in range(500):
            t.ping.call_one().get()
        modes = ["off", "on", "in_span", *(["off_again"] if a.control else [])]
        lat: dict[str, list[float]] = {m: [] for m in modes}
        rate: dict[str, list[float]] = {m: [] for m in modes}
        cpu: dict[str, list[float]] = {m: [] for m in modes}  # CPU s per call, client + proc
        for b in range(a.blocks):
            k = b % len(modes)
            for m in modes[k:] + modes[:k]:  # rotate the order
                telemetry.ON = m in ("on", "in_span")
                block = span("block") if m == "in_span" else None
                c0, p0 = time.process_time(), t.cpu.call_one().get()
                if block is not None:
                    block.__enter__()
                latency, calls_per_s = timed_block(t, a.calls, a.burst)
                rate[m].append(calls_per_s)
                if block is not None:
                    block.__exit__(None, None, None)
                    t.flush.call_one().get()  # not timed: the exports of this block
                    _flush()
                p1, c1 = t.cpu.call_one().get(), time.process_time()  # the exports counted
                cpu[m].append((c1 - c0 + p1 - p0) / (a.calls + a.burst + 2))
                lat[m].append(latency)
        telemetry.ON = True
        exports = t.exports.call_one().get()
        procs.stop().get()
        from opentelemetry import trace

        trace.get_tracer_provider().shutdown()  # type: ignore[attr-defined]
    finally:
        receiver.kill()
        receiver.wait()
    print(f"{a.blocks} blocks per mode, {a.calls} call_one + {a.burst} in flight per block")
    print(f"sampler parentbased_traceidratio {a.ratio}; the proc's endpoint spans: {exports}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    print(
        f"{'mode':8} {'call_one us':>12} {'x off':>7} {'calls/s':>9} {'x off':>7}"
        f" {'cpu us/call':>12} {'x off':>7}"
    )
    for m in modes:
        l_m, r_m, c_m = (statistics.median(x[m]) for x in (lat, rate, cpu))
        l_off, r_off, c_off = (statistics.median(x["off"]) for x in (lat, rate, cpu))
        print(
            f"{m:8} {l_m * 1e6:12.1f} {l_m / l_off:7.3f} {r_m:9.0f} {r_m / r_off:7.3f}"
            f" {c_m * 1e6:12.1f} {c_m / c_off:7.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
