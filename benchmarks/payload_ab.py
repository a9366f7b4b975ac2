#!/usr/bin/env python3
"""A 1 MiB payload against a raw socketpair transfer, two danaus trees alternating.

    python benchmarks/payload_ab.py --old /path/to/other/checkout [--rounds 6]

Issue 39's "1 MiB payload at least 0.6x of a raw socketpair transfer", measured
so a loaded machine falls on every side alike. Each round runs one fresh
client process per tree (old then new, the order swapped each round), each
on its own tree's ``src`` (``PYTHONPATH``, so its procs import it too). A
client forks its socketpair child first (the floor of ``floor_bench.py``: the
bytes sent with ``sendall`` to a forked child that ``recv_into``s them into a
preallocated buffer and acks), spawns one proc with an actor, then
alternates, ``--reps`` times: a batch of raw transfers, then a batch of
``call_one(payload)`` per payload kind (a numpy array, a CPU torch tensor if
torch is installed, ``bytes``), each returning ``len``. The ratio is taken
batch by batch (danaus's MiB/s over the raw transfer's measured just
before), its median per client, then the median over rounds; ``_ratio_p10``
is the same from each batch's 10th percentiles (the calls the scheduler
disturbed least). Also: the
CPU per call of the client and of the proc (``/proc``), and their voluntary
context switches per call (both processes together, over all batches),
steadier than wall time on a shared machine.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent
MiB = 1 << 20


def _proc_cpu(pid: int) -> tuple[float, int]:
    """CPU seconds and voluntary context switches of all threads of ``pid``."""
    ticks = vcs = 0
    for task in glob.glob(f"/proc/{pid}/task/*"):
        try:
            with open(task + "/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])
            with open(task + "/status") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches"):
                        vcs += int(line.split()[1])
        except (FileNotFoundError, ProcessLookupError):
            pass
    return ticks / os.sysconf("SC_CLK_TCK"), vcs


def _self_cpu() -> tuple[float, int]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime, r.ru_nvcsw


def _floor_child(size: int) -> tuple[socket.socket, int]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:  # child: read each transfer into one preallocated buffer, ack it
        a.close()
        view = memoryview(bytearray(size))
        while True:
            n = 0
            while n < size:
                k = b.recv_into(view[n:])
                if not k:
                    os._exit(0)
                n += k
            b.sendall(b"k")
    b.close()
    return a, pid


def child(size: int, reps: int, batch: int, kinds: list[str]) -> dict[str, Any]:
    import numpy as np

    sock, floor_pid = _floor_child(size)  # forked before danaus starts any thread
    src = np.full(size, 7, dtype=np.uint8)

    from danaus.actor import Actor, endpoint, this_host

    class Sink(Actor):
        @endpoint
        def nbytes(self, x: Any) -> int:
            return len(x)

        @endpoint
        def pid(self) -> int:
            return os.getpid()

    procs = this_host().spawn_procs(per_host={"gpus": 1})
    sink = procs.spawn("sink", Sink)
    proc_pid = sink.pid.call_one().get(timeout=60)
    payloads: dict[str, Any] = {"numpy": src, "bytes": bytes(size)}
    if "torch" in kinds:
        try:
            import torch

            payloads["torch"] = torch.full((size,), 7, dtype=torch.uint8)
        except ImportError:
            kinds = [k for k in kinds if k != "torch"]

    def floor_once() -> None:
        sock.sendall(memoryview(src))
        if sock.recv(1) != b"k":
            raise RuntimeError("the floor's child did not ack")

    def call(x: Any) -> Any:
        def once() -> None:
            n = sink.nbytes.call_one(x).get(timeout=60)
            assert n == size, n

        return once

    def timed(fn: Any) -> tuple[float, float]:
        """Median and 10th percentile of the seconds per op of one batch."""
        out = []
        for _ in range(batch):
            t = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t)
        out.sort()
        return statistics.median(out), out[len(out) // 10]

    names = ["floor", *kinds]
    fns = {"floor": floor_once, **{k: call(payloads[k]) for k in kinds}}
    peers = {"floor": floor_pid, **{k: proc_pid for k in kinds}}
    got: dict[str, list[tuple[float, float]]] = {k: [] for k in names}
    # CPU and wake-ups summed over all batches of a kind (the kernel counts a thread's
    # CPU in 10 ms ticks: one batch is too short to read it from /proc).
    cost = {k: [0.0, 0] for k in names}
    for k in names:  # warm: the proc imports torch on its first tensor
        for _ in range(5):
            fns[k]()
    for _ in range(reps):
        for k in names:
            me0, peer0 = _self_cpu(), _proc_cpu(peers[k])
            got[k].append(timed(fns[k]))
            me1, peer1 = _self_cpu(), _proc_cpu(peers[k])
            cost[k][0] += me1[0] - me0[0] + peer1[0] - peer0[0]
            cost[k][1] += me1[1] - me0[1] + peer1[1] - peer0[1]
    procs.stop().get(timeout=60)
    sock.close()
    os.waitpid(floor_pid, 0)
    mib = size / MiB
    ops = reps * batch
    out: dict[str, Any] = {"floor_mib_s": statistics.median(mib / t for t, _ in got["floor"])}
    for k in names:
        out[f"{k}_cpu_us"] = 1e6 * cost[k][0] / ops
        out[f"{k}_wakeups"] = cost[k][1] / ops
    for k in kinds:
        out[f"{k}_mib_s"] = statistics.median(mib / t for t, _ in got[k])
        out[f"{k}_ratio"] = statistics.median(
            f / t for (f, _), (t, _) in zip(got["floor"], got[k], strict=True)
        )
        # The same from each batch's 10th percentiles: the least disturbed calls of
        # each side, what the code costs when the scheduler does not get in the way.
        out[f"{k}_ratio_p10"] = statistics.median(
            f / t for (_, f), (_, t) in zip(got["floor"], got[k], strict=True)
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True, help="a danaus checkout to compare with")
    ap.add_argument("--new", default=str(HERE))
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--reps", type=int, default=6, help="batches per kind in one client")
    ap.add_argument("--batch", type=int, default=40, help="transfers or calls per batch")
    ap.add_argument("--size", type=int, default=MiB)
    ap.add_argument("--kinds", default="numpy,torch,bytes")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    kinds = a.kinds.split(",")
    if a.child:
        print(json.dumps(child(a.size, a.reps, a.batch, kinds)))
        return
    trees = {"old": str(Path(a.old) / "src"), "new": str(Path(a.new) / "src")}
    got: dict[str, list[dict[str, Any]]] = {"old": [], "new": []}
    print(f"load average at the start: {os.getloadavg()}", flush=True)
    for r in range(a.rounds):
        order = ["old", "new"] if r % 2 == 0 else ["new", "old"]
        for which in order:
            cmd = [sys.executable, __file__, "--old", a.old, "--child", "--size", str(a.size),
                   "--reps", str(a.reps), "--batch", str(a.batch), "--kinds", a.kinds]  # fmt: skip
            out = subprocess.run(
                cmd, capture_output=True, text=True, timeout=900, check=True,
                env={**os.environ, "PYTHONPATH": trees[which]},
            )  # fmt: skip
            got[which].append(json.loads(out.stdout.strip().splitlines()[-1]))
            row = {k: round(v, 3) for k, v in got[which][-1].items()}
            print(f"round {r + 1} {which}: {row}", flush=True)
    print(f"load average at the end: {os.getloadavg()}\n")
    print(f"{'figure':<20}{'old med':>10}{'new med':>10}{'new/old':>9}")
    for key in got["new"][0]:
        if key not in got["old"][0]:
            continue
        o = statistics.median(x[key] for x in got["old"])
        n = statistics.median(x[key] for x in got["new"])
        print(f"{key:<20}{o:>10.3f}{n:>10.3f}{n / o:>9.2f}")


if __name__ == "__main__":
    main()
