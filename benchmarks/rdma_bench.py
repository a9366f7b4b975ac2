"""RDMA bandwidth: ``read_into`` / ``write_from`` against a raw in-process copy.

One proc owns a buffer per size; the client reads it into, and writes it
from, memory of its own. The baseline is ``numpy.copyto`` of the same number
of bytes inside the client, measured in the same run: the best a one-copy
transfer could hope for. Every buffer is touched before timing, so page
faults are not counted on either side. Each figure is the median of
``--repeat`` runs; a table stops early once ``--budget`` seconds pass.

Four tables, then all rows in one with the ratio to the raw copy:

- ``process_vm``: a proc on this host.
- ``tcp``: a proc on another host: a ``ProcessJob`` worker on loopback, which
  has a host token of its own, so the bytes go over its authenticated data
  connection.
- ``netns``: a ``danaus worker`` in a network namespace of its own, joined to
  this one by a veth pair and a bridge (``danaus._netlab``, the host lab);
  needs root and ``ip``, skipped otherwise. The namespace is always removed.
- ``monarch``: PyTorch Monarch 0.7's ``RDMABuffer`` (``systems/monarch_rdma_bench.py``
  under ``benchmarks/.envs/monarch/bin/python``), with its TCP fallback where
  there is no ibverbs hardware; skipped when that interpreter is missing.

Usage::

    python benchmarks/rdma_bench.py                    # 1, 16, 128, 512 MiB, all tables
    python benchmarks/rdma_bench.py --smoke            # tiny sizes, process_vm and tcp only
    python benchmarks/rdma_bench.py --where tcp,netns  # some tables only
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from danaus.actor import Actor, HostMesh, attach_to_workers, endpoint, this_host
from danaus.job import ProcessJob
from danaus.rdma import RDMABuffer, get_rdma_backend, get_rdma_local_path

MiB = 1 << 20
SIZES = [1 * MiB, 16 * MiB, 128 * MiB, 512 * MiB]
SMOKE_SIZES = [64 << 10, 1 * MiB, 4 * MiB]
Row = tuple[int, float, float, float]  # size, raw copy, read_into, write_from (MiB/s)
HERE = Path(__file__).resolve().parent
REPO = HERE.parent
TABLES = {
    "process_vm": "owner on this host (process_vm)",
    "tcp": "owner on another host (tcp: a ProcessJob worker on loopback)",
    "netns": "owner on another host in a network namespace (tcp over a veth pair and bridge)",
    "monarch": "Monarch 0.7 RDMABuffer, owner on this host (its TCP fallback without ibverbs)",
}


class Owner(Actor):
    """Holds one registered buffer per size."""

    def __init__(self) -> None:
        self.held: dict[int, tuple[np.ndarray, RDMABuffer]] = {}

    @endpoint
    def make(self, n: int) -> RDMABuffer:
        data = np.full(n, 7, dtype=np.uint8)  # touched: no page faults during the runs
        buf = RDMABuffer(data)
        self.held[n] = (data, buf)
        return buf

    @endpoint
    def release(self, n: int) -> None:
        _, buf = self.held.pop(n)
        buf.drop().get(timeout=60)

    @endpoint
    def first_and_last(self, n: int) -> tuple[int, int]:
        data = self.held[n][0]
        return int(data[0]), int(data[-1])


def timed(fns: list[Callable[[], object]], repeat: int, deadline: float) -> list[list[float]]:
    """Seconds per run of each of ``fns``: one warm-up each, then up to ``repeat`` rounds.

    The functions take turns within a round, so a noisy neighbour slows all of them
    alike rather than whichever happened to be running.
    """
    for fn in fns:
        fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeat):
        for fn, ts in zip(fns, times, strict=True):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        if time.monotonic() > deadline:
            break
    return times


def rate(nbytes: int, times: list[float]) -> float:
    return nbytes / statistics.median(times) / MiB


def measure(
    owner: Any, n: int, repeat: int, deadline: float, backend: str
) -> tuple[int, float, float, float]:
    """``(n, raw copy, read_into, write_from)`` in MiB/s for ``n`` bytes."""
    buf = owner.make.call_one(n).get(timeout=120)
    assert buf.backend == backend, f"expected the {backend} backend, got {buf.backend}"
    src = np.full(n, 9, dtype=np.uint8)
    dst = np.ones(n, dtype=np.uint8)  # touched
    out = np.ones(n, dtype=np.uint8)  # touched; where read_into lands
    raw, read, write = timed(
        [
            lambda: np.copyto(dst, src),
            lambda: buf.read_into(out).get(timeout=120),
            lambda: buf.write_from(src).get(timeout=120),
        ],
        repeat,
        deadline,
    )
    assert out[0] == out[-1] == 9, "read_into did not deliver the bytes write_from wrote"
    assert owner.first_and_last.call_one(n).get(timeout=60) == (9, 9)
    owner.release.call_one(n).get(timeout=60)
    return n, rate(n, raw), rate(n, read), rate(n, write)


def run_on(
    hosts: HostMesh, backend: str, sizes: list[int], repeat: int, deadline: float, budget: float
) -> list[Row]:
    procs = hosts.spawn_procs(per_host={"owner": 1})
    owner = procs.spawn("owner", Owner)
    rows = []
    try:
        for n in sizes:
            if time.monotonic() > deadline:
                print(f"(budget of {budget:g} s spent; skipping {n // 1024} KiB and up)")
                break
            rows.append(measure(owner, n, repeat, deadline, backend))
    finally:
        procs.stop().get(timeout=60)
    return rows


def run_netns(sizes: list[int], repeat: int, deadline: float, budget: float) -> list[Row] | str:
    """The owner on a worker in a network namespace of its own; the client stays here.

    Returns the rows, or why it could not run. The namespace, its veth and the
    bridge are removed whatever happens (the project's host lab, ``danaus._netlab``,
    which the multi-host tests and ``scripts/netlab`` use too; datacenter links).
    """
    if sys.platform != "linux" or os.geteuid() != 0:
        return "skipped: creating network namespaces needs root on Linux"
    if shutil.which("ip") is None:
        return "skipped: no `ip` (iproute2) on PATH"
    from danaus import _netlab_workers

    secret = os.environ["DANAUS_SECRET"]  # the one main() set: a client has one secret
    try:
        with _netlab_workers.lab(1, secret=secret) as (_, started):
            workers = [w.address for w in started]
            hosts = attach_to_workers(workers=workers, secret=secret)
            try:
                return run_on(hosts, "tcp", sizes, repeat, deadline, budget)
            finally:
                hosts.shutdown().get(timeout=60)
    except Exception as e:
        return f"error: {type(e).__name__}: {e}"


def run_monarch(
    python: Path, sizes: list[int], repeat: int, budget: float
) -> tuple[str, list[Row] | str]:
    """Monarch's ``RDMABuffer`` in its own interpreter: ``(backend, rows or why not)``.

    The worker prints each row as it finishes; a hang is killed (whole process
    group) after ``budget`` plus a start-up allowance and reported as a timeout.
    """
    if not python.exists():
        return "?", (
            f"skipped: no {python} (install with `bash benchmarks/setup_comparators.sh monarch`)"
        )
    script = HERE / "systems" / "monarch_rdma_bench.py"
    cmd = [str(python), str(script), "--sizes", ",".join(map(str, sizes))]
    cmd += ["--repeat", str(repeat), "--budget", f"{budget:g}"]
    limit = budget + 60
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=str(HERE / "systems"),
            start_new_session=True,
        )
        timed_out = False
        try:
            proc.wait(limit)
        except subprocess.TimeoutExpired:
            timed_out = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # also any procs it left behind
        proc.wait()
        out.seek(0)
        text = out.read()
    backend, rows, errors = "?", [], []
    for line in text.splitlines():
        if line.startswith("RDMA_INFO "):
            backend = json.loads(line[len("RDMA_INFO ") :]).get("backend", "?")
        elif line.startswith("RDMA_ROW "):
            r = json.loads(line[len("RDMA_ROW ") :])
            if not r["verified"]:
                errors.append(f"{r['n']} bytes: transferred bytes did not verify")
                continue
            rows.append((r["n"], r["raw"], r["read"], r["write"]))
        elif line.startswith("RDMA_ERROR "):
            errors.append(line[len("RDMA_ERROR ") :])
    if timed_out:
        errors.append(f"timeout: killed after {limit:g} s")
    elif proc.returncode != 0 and not errors:
        errors.append(f"exited with code {proc.returncode}: {text.strip()[-300:]}")
    for e in errors:
        print(f"  monarch: {e}")
    return backend, rows if rows else ("; ".join(errors) or "no result")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny sizes only (a quick check)")
    ap.add_argument("--repeat", type=int, default=7, help="timed runs per figure (median)")
    ap.add_argument(
        "--budget", type=float, default=120.0, help="seconds per table; a table stops past it"
    )
    ap.add_argument(
        "--where",
        default=None,
        help=f"comma-separated tables out of {','.join(TABLES)} "
        "(default: all; --smoke: process_vm,tcp)",
    )
    ap.add_argument(
        "--monarch-python",
        type=Path,
        default=HERE / ".envs" / "monarch" / "bin" / "python",
        help="interpreter with torchmonarch (default: benchmarks/.envs/monarch/bin/python)",
    )
    args = ap.parse_args(argv)
    where = args.where or ("process_vm,tcp" if args.smoke else ",".join(TABLES))
    if where == "both":  # the old spelling
        where = "process_vm,tcp"
    chosen = [w.strip() for w in where.split(",") if w.strip()]
    unknown = [w for w in chosen if w not in TABLES]
    if unknown:
        ap.error(f"unknown --where {unknown}; choose from {', '.join(TABLES)}")
    sizes = SMOKE_SIZES if args.smoke else SIZES
    repeat = 3 if args.smoke else args.repeat

    # One secret for the whole run: the ProcessJob and the namespace's worker must share
    # it, since a client authenticates with one secret.
    os.environ.setdefault("DANAUS_SECRET", secrets.token_hex(32))
    print(
        f"danaus backend: {get_rdma_backend()} (local path {get_rdma_local_path()}); "
        f"median of up to {repeat} runs; MiB/s"
    )
    results: dict[str, list[Row] | str] = {}
    for name in TABLES:
        if name not in chosen:
            continue
        deadline = time.monotonic() + args.budget
        print(f"\n{TABLES[name]}:", flush=True)
        got: list[Row] | str
        if name == "process_vm":
            got = run_on(this_host(), "process_vm", sizes, repeat, deadline, args.budget)
        elif name == "tcp":
            job = ProcessJob({"hosts": 1})
            job.apply()
            try:
                hosts = job.state().hosts
                got = run_on(hosts, "tcp", sizes, repeat, deadline, args.budget)
                hosts.shutdown().get(timeout=60)
            finally:
                job.kill()
        elif name == "netns":
            got = run_netns(sizes, repeat, deadline, args.budget)
        else:
            backend, got = run_monarch(args.monarch_python, sizes, repeat, args.budget)
            print(f"  (Monarch RDMA backend: {backend})")
        results[name] = got
        if isinstance(got, str):
            print(f"  {got}")
        else:
            table(got)
    if len(results) > 1:
        print("\nall rows (ratio = rate / raw copy in the same run):")
        summary(results)
    return 0


def _size(n: int) -> str:
    return f"{n // MiB} MiB" if n >= MiB else f"{n // 1024} KiB"


def table(rows: list[Row]) -> None:
    head = ("size", "raw copy", "read_into", "ratio", "write_from", "ratio")
    print("{:>10} {:>10} {:>10} {:>6} {:>11} {:>6}".format(*head))
    for n, r_raw, r_read, r_write in rows:
        print(
            f"{_size(n):>10} {r_raw:>10.0f} {r_read:>10.0f} {r_read / r_raw:>6.0%} "
            f"{r_write:>11.0f} {r_write / r_raw:>6.0%}"
        )


def summary(results: dict[str, list[Row] | str]) -> None:
    head = ("path", "size", "raw copy", "read_into", "ratio", "write_from", "ratio")
    print("{:<11} {:>8} {:>10} {:>10} {:>6} {:>11} {:>6}".format(*head))
    for name, got in results.items():
        if isinstance(got, str):
            print(f"{name:<11} {got}")
            continue
        for n, r_raw, r_read, r_write in got:
            print(
                f"{name:<11} {_size(n):>8} {r_raw:>10.0f} {r_read:>10.0f} "
                f"{r_read / r_raw:>6.0%} {r_write:>11.0f} {r_write / r_raw:>6.0%}"
            )
    local = results.get("process_vm")
    if isinstance(local, list):
        big = [r for r in local if r[0] >= 128 * MiB]
        if big:
            worst = min(min(r[2], r[3]) / r[1] for r in big)
            verdict = "met" if worst >= 0.5 else "MISSED"
            print(
                f"\ntarget: one host, 128 MiB and up, >= 50% of the raw copy: "
                f"worst {worst:.0%} -> {verdict}"
            )


if __name__ == "__main__":
    sys.exit(main())
