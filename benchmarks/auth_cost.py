"""The cost of authenticating every frame on a TCP connection (issue 12).

Two processes on this machine, one Runtime each, talking over TCP on
127.0.0.1: the client sends frames to the server, which answers on the same
connection. Run once with a job secret (handshake, then an HMAC-SHA256 tag on
every frame, checked before the frame is parsed) and once ``insecure`` (no
secret: what every TCP connection was before, minus the handshake), and
compare::

    .venv/bin/python benchmarks/auth_cost.py            # ~20 s
    .venv/bin/python benchmarks/auth_cost.py --smoke    # ~3 s

Figures: sequential round trips (µs each), 10,000 small frames pipelined
(frames/s), and 256 MiB in 4 MiB buffers (GB/s, one direction); the median
of three alternating rounds.
"""

from __future__ import annotations

import argparse
import os
import queue
import statistics
import subprocess
import sys
import time
from typing import Any

SECRET = b"b" * 64
# Frames travel with typed headers; the benchmark takes over three kinds whose
# handlers it replaces on both ends (nothing else sends them on these runtimes):
# BOUNCE is the ping (echoed with its number), REFUSED a counted frame, LOST "done".


def _runtime(name: str, secure: bool) -> Any:
    import danaus.config
    from danaus._runtime.messaging.runtime import Runtime

    # Each small frame is written at once, secure or not: batching back-to-back small
    # frames (send_batch) applies to unsealed frames only, and this loop waits on a
    # plain queue (no danaus wait flushes them), so it would hold every insecure ping
    # for send_batch_delay and measure that instead of the cost of the tag.
    danaus.config.configure(send_batch=1)
    from danaus._transport.address import make_job_dir

    return Runtime(name, make_job_dir(), secret=SECRET if secure else None, insecure=not secure)


def serve(secure: bool) -> None:
    from danaus._wire.frame import encode_frame
    from danaus._wire.protocol import Bounce, Kind, Lost, wire

    rt = _runtime("bench-server", secure)
    counted = [0, 0]

    def ping(conn: Any, msg: Any) -> None:
        conn.send(encode_frame(wire(Bounce(None, msg.header.dest, ""))))  # type: ignore[arg-type]

    def count(conn: Any, msg: Any) -> None:
        counted[0] += 1
        counted[1] += sum(len(b) for b in msg.buffers)

    def done(conn: Any, msg: Any) -> None:
        conn.send(encode_frame(wire(Lost(str(counted[0]), str(counted[1])))))
        counted[0] = counted[1] = 0

    rt.handlers.update({Kind.BOUNCE: ping, Kind.REFUSED: count, Kind.LOST: done})
    rt.start(in_thread=False)
    print(rt.listen_tcp("127.0.0.1", "127.0.0.1"), flush=True)
    rt.loop.run_forever()


def measure(secure: bool, smoke: bool) -> dict[str, float]:
    from danaus._wire.ids import ProcId
    from danaus._wire.protocol import Bounce, Kind, Lost, Refused

    def ping(i: int) -> Any:
        return Bounce(None, str(i), "")  # type: ignore[arg-type]

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    mode = "secure" if secure else "insecure"
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", mode], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert server.stdout is not None
        addr = server.stdout.readline().strip()
        rt = _runtime("bench-client", secure)
        got: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        rt.handlers[Kind.BOUNCE] = lambda conn, msg: got.put((msg.header.dest,))
        rt.handlers[Kind.LOST] = lambda conn, msg: got.put((0, *map(int, msg.header)))
        rt.start(in_thread=True)
        peer = ProcId("bench-server", addr)
        rt.send(peer, ping(-1))
        got.get(timeout=30)  # connected and authenticated
        n = 300 if smoke else 5000
        t = time.perf_counter()
        for i in range(n):
            rt.send(peer, ping(i))
            got.get(timeout=30)
        rtt = (time.perf_counter() - t) / n * 1e6
        n = 1000 if smoke else 10_000
        body = b"x" * 100
        t = time.perf_counter()
        for _ in range(n):
            rt.send(peer, Refused("count"), body)
        rt.send(peer, Lost("done", ""))
        assert got.get(timeout=60)[1] == n
        rate = n / (time.perf_counter() - t)
        chunk = bytearray(4 << 20)
        total = (32 if smoke else 256) << 20
        t = time.perf_counter()
        for _ in range(total // len(chunk)):
            rt.send(peer, Refused("bulk"), b"", [chunk])
        rt.send(peer, Lost("done", ""))
        assert got.get(timeout=120)[2] == total
        gbps = total / (time.perf_counter() - t) / 1e9
        return {"round trip µs": rtt, "small frames/s": rate, "bulk GB/s": gbps}
    finally:
        server.kill()
        server.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (median)")
    ap.add_argument("--serve", choices=["secure", "insecure"])
    args = ap.parse_args()
    if args.serve:
        serve(args.serve == "secure")
        return
    # Alternate the two modes round by round (a shared machine drifts), report medians.
    runs: dict[str, list[dict[str, float]]] = {"insecure": [], "secure": []}
    for _ in range(1 if args.smoke else args.rounds):
        for mode in runs:
            runs[mode].append(measure(mode == "secure", args.smoke))
    keys = list(runs["insecure"][0])
    rows = {m: {k: statistics.median(r[k] for r in rs) for k in keys} for m, rs in runs.items()}
    print(f"{'':28}" + "".join(f"{k:>18}" for k in keys))
    for mode, row in rows.items():
        label = "per-frame HMAC" if mode == "secure" else "insecure (no auth)"
        print(f"{label:28}" + "".join(f"{row[k]:>18.2f}" for k in keys))
    ratios = [rows["secure"][k] / rows["insecure"][k] for k in keys]
    print(f"{'secure / insecure':28}" + "".join(f"{r:>18.3f}" for r in ratios))


if __name__ == "__main__":
    main()
