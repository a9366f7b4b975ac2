"""Spawn time as a user's plain script sees it, A/B-comparable across checkouts.

Each measurement is a fresh client process, written the way a training script is:
``import torch`` at the top (``--torch``; without it, danaus alone), then
``this_host().spawn_procs(per_host={"gpus": N})``, one trivial actor on it and
a call to it (so every proc is really up), then ``procs.stop().get()``. One
spawn + stop warms up (it starts the host agent and its zygote); then each
sample times spawn + actor + call ("up"), and, apart, the stop. It also reads
the CPU time that the client, its host agent, the zygote and the procs (the
zygote's reaped children) spent per spawn and stop: on a shared machine that
moves far less than the wall times, and a spawn is mostly CPU.

    python benchmarks/spawn_plain.py                       # this checkout, 4 and 64, +-torch
    python benchmarks/spawn_plain.py --procs 4 --torch     # one variant
    python benchmarks/spawn_plain.py --src A/src --src B/src --rounds 5   # A, B, A, B, ...
    python benchmarks/spawn_plain.py --src "$PWD/src|DANAUS_SPIN_WAIT=0" --src "$PWD/src"

With several ``--src`` (a checkout's ``src`` directory each, optionally with
environment variables after a ``|``), the clients of each, with and without
torch, run in turn, so a busy host weighs on all of them alike. ``--bisect-good SRC --factor F``
compares ``--src`` (default: this checkout's) with SRC, alternately, and exits
1 if its median (``--key up`` or ``cpu``) is more than F times SRC's, 0 if
not, 125 if it could not be measured: for ``git bisect run`` (run a copy of
this file from outside the tree being bisected).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"

CLIENT = r"""
import json, os, sys, time
if {torch!r}:
    import torch  # noqa: F401  as at the top of a training script
from danaus.actor import Actor, endpoint, this_host


class Ping(Actor):
    @endpoint
    def ping(self) -> int:
        return 0


def children(pid):
    out = []
    for tid in os.listdir(f"/proc/{{pid}}/task"):
        try:
            with open(f"/proc/{{pid}}/task/{{tid}}/children") as f:
                out += [int(p) for p in f.read().split()]
        except FileNotFoundError:  # a thread that ended meanwhile
            pass
    return out


def cmdline(pid):
    try:
        with open(f"/proc/{{pid}}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def ticks(pid, reaped=False):
    with open(f"/proc/{{pid}}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # utime stime, and cutime cstime: the children it has reaped
    return sum(int(x) for x in fields[11:15 if reaped else 13])


def cpu(agent, zygote):
    # CPU time (clock ticks) of this client (every thread), its host agent, the
    # zygote, and the procs the zygote has reaped (its children's times).
    z_all = ticks(zygote, reaped=True)
    z_own = ticks(zygote)
    return {{"client": ticks(os.getpid()), "agent": ticks(agent), "zygote": z_own,
             "procs": z_all - z_own}}


def all_reaped(zygote):
    for _ in range(1000):
        if not children(zygote):
            return
        time.sleep(0.01)


def main():
    host = this_host()
    procs = host.spawn_procs(per_host={{"gpus": {n}}})
    procs.spawn("ping", Ping).ping.call().get()
    procs.stop().get()
    agent = next(p for p in children(os.getpid()) if b"danaus._runtime.hosting.agent" in cmdline(p))
    zygote = children(agent)[0]
    all_reaped(zygote)
    c0 = cpu(agent, zygote)
    up, stop = [], []
    for _ in range({samples}):
        t0 = time.perf_counter()
        procs = host.spawn_procs(per_host={{"gpus": {n}}})
        procs.spawn("ping", Ping).ping.call().get()
        t1 = time.perf_counter()
        procs.stop().get()
        t2 = time.perf_counter()
        up.append(t1 - t0)
        stop.append(t2 - t1)
    all_reaped(zygote)
    c1 = cpu(agent, zygote)
    hz = os.sysconf("SC_CLK_TCK") * {samples}
    cpu_s = {{k: (c1[k] - c0[k]) / hz for k in c0}}
    import danaus
    out = {{"up": up, "stop": stop, "cpu": cpu_s, "danaus": danaus.__file__}}
    print("SPAWN_PLAIN " + json.dumps(out))


main()
"""


def run_client(src: str, n: int, torch: bool, samples: int, timeout: float) -> dict[str, Any]:
    """One fresh client of ``src`` (``PATH`` or ``PATH|VAR=VALUE,...``): its samples."""
    path, _, extra = src.partition("|")
    env = {**os.environ, "PYTHONPATH": path}
    for kv in filter(None, extra.split(",")):
        k, _, v = kv.partition("=")
        env[k] = v
    code = CLIENT.format(torch=torch, n=n, samples=samples)
    r = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd="/",  # not the checkout: its src is what is measured, through PYTHONPATH
    )
    for line in r.stdout.splitlines():
        if line.startswith("SPAWN_PLAIN "):
            out: dict[str, Any] = json.loads(line[len("SPAWN_PLAIN ") :])
            if not out["danaus"].startswith(str(Path(path).resolve())):
                raise RuntimeError(f"measured {out['danaus']}, not {path}")
            return out
    raise RuntimeError(
        f"client failed (rc {r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    )


def compare(
    variants: list[tuple[str, bool]], n: int, rounds: int, samples: int, keep_going: bool
) -> dict[tuple[str, bool], Any]:
    """Run a client of each (src, torch) variant in turn (A, B, A, B, ...); samples pooled.

    With ``keep_going``, a client that fails is counted and the others go on."""
    pooled: dict[tuple[str, bool], Any] = {
        v: {"up": [], "stop": [], "cpu": [], "failed": []} for v in variants
    }
    timeout = 60 + samples * (2 if n <= 8 else 30)
    for _ in range(rounds):
        for v in variants:
            try:
                out = run_client(v[0], n, v[1], samples, timeout)
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                if not keep_going:
                    raise
                pooled[v]["failed"].append(str(e).strip().splitlines()[-1][:300])
                continue
            pooled[v]["up"] += out["up"]
            pooled[v]["stop"] += out["stop"]
            pooled[v]["cpu"].append(out["cpu"])
    return pooled


def median_ms(xs: list[float]) -> float:
    return statistics.median(xs) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--src", action="append", help="a checkout's src, PATH or PATH|VAR=VALUE,... (repeatable)"
    )
    ap.add_argument("--procs", type=int, action="append", help="procs per spawn (default 4, 64)")
    t = ap.add_mutually_exclusive_group()
    t.add_argument("--torch", dest="torch", action="store_const", const=[True])
    t.add_argument("--no-torch", dest="torch", action="store_const", const=[False])
    ap.add_argument("--rounds", type=int, default=3, help="clients per src and variant")
    ap.add_argument("--samples", type=int, default=0, help="samples per client (default 10 / 3)")
    ap.add_argument("--bisect-good", metavar="SRC", help="exit 1 if slower than SRC by --factor")
    ap.add_argument("--factor", type=float, default=2.0)
    ap.add_argument("--key", choices=("up", "cpu"), default="up", help="what --factor compares")
    a = ap.parse_args()
    srcs = a.src or [str(SRC)]
    if a.bisect_good:
        srcs = [a.bisect_good, *(a.src or [str(SRC)])]
    sizes = a.procs or [4, 64]
    torches = a.torch if a.torch is not None else [False, True]
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):
        print("(PYTHONDONTWRITEBYTECODE is set: every import compiles its source)")
    slow = False
    for n in sizes:
        samples = a.samples or (10 if n <= 8 else 3)
        variants = [(src, torch) for torch in torches for src in srcs]
        try:
            pooled = compare(variants, n, a.rounds, samples, keep_going=not a.bisect_good)
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            print(e, file=sys.stderr)
            if a.bisect_good:
                sys.exit(125)  # git bisect: skip this commit
            raise
        for torch in torches:
            print(
                f"spawn {n} procs, client {'with' if torch else 'without'} torch "
                f"(medians; up: spawn + actor + call; cpu per spawn and stop):"
            )
            for src in srcs:
                p = pooled[(src, torch)]
                for why in p["failed"]:
                    print(f"  a client failed: {why}  {src}")
                if not p["cpu"]:
                    continue
                cpu = {k: median_ms([c[k] for c in p["cpu"]]) for k in p["cpu"][0]}
                p["cpu_total"] = [sum(c.values()) for c in p["cpu"]]
                parts = " ".join(f"{k} {v:.0f}" for k, v in cpu.items())
                print(
                    f"  up {median_ms(p['up']):7.1f} ms  stop {median_ms(p['stop']):7.1f} ms  "
                    f"cpu {median_ms(p['cpu_total']):7.1f} ms ({parts})  n={len(p['up'])}  {src}"
                )
            if a.bisect_good:
                key = "cpu_total" if a.key == "cpu" else "up"
                good = statistics.median(pooled[(srcs[0], torch)][key])
                this = statistics.median(pooled[(srcs[1], torch)][key])
                slow |= this > a.factor * good
                print(f"  {a.key} ratio {this / good:.2f} (slow above {a.factor})")
        sys.stdout.flush()
    sys.exit(1 if slow else 0)


if __name__ == "__main__":
    main()
