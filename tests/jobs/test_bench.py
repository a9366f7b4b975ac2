"""Benchmark: time from ``apply()`` to a ready mesh, against starting the workers by hand.

Slow-marked (``-m slow``); ``benchmarks/jobs.py`` runs it and prints the table.
Every measurement is a fresh client process (a client holds one job secret);
the kinds alternate within each round so drift hits them alike.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

import pytest

from .conftest import SSHD, Scripts, Slurm, free_port

ROUNDS = int(os.environ.get("DANAUS_BENCH_ROUNDS", "3"))

CLIENT = """
    import json, os, subprocess, sys, time
    from danaus.actor import attach_to_workers
    from danaus.job import SlurmJob, SSHJob

    kind, port, arg = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    t0 = time.perf_counter()
    if kind == "by hand":
        secret = os.urandom(16).hex()
        env = {**os.environ, "DANAUS_SECRET": secret}
        workers = []
        for ip in ("127.0.0.1", "127.0.0.2"):
            p = subprocess.Popen([sys.executable, "-m", "danaus", "worker", "--listen",
                                  f"tcp://{ip}:{port}"], env=env, stdout=subprocess.PIPE, text=True)
            workers.append(p)
        addrs = [p.stdout.readline().split()[-1] for p in workers]
        mesh = attach_to_workers(workers=addrs, secret=secret)
        mesh.initialized.get(timeout=60)
        elapsed = time.perf_counter() - t0
        for p in workers:
            p.kill(); p.wait(); p.stdout.close()
    else:
        if kind == "SSHJob":
            job = SSHJob(["127.0.0.1", "127.0.0.2"], python_exe=sys.executable,
                         ssh_args=json.loads(arg), port=port)
        else:
            job = SlurmJob({"hosts": 2}, python_exe=sys.executable, port=port, log_dir=arg)
        job.apply()
        job.state(cached_path=None).hosts.initialized.get(timeout=60)
        elapsed = time.perf_counter() - t0
        job.kill()
    print(json.dumps(elapsed), flush=True)
"""


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_bench_apply_to_ready_mesh(sshd: SSHD, slurm: Slurm, scripts: Scripts) -> None:
    path = scripts.write(CLIENT)
    kinds = {
        "by hand": "",
        "SSHJob": json.dumps(sshd.ssh_args),
        "SlurmJob": str(scripts.tmp_path),
    }
    times: dict[str, list[float]] = {k: [] for k in kinds}
    for _ in range(ROUNDS):
        for kind, arg in kinds.items():
            client = scripts.start_path(path, kind, str(free_port()), arg)
            out, err = client.communicate(timeout=120)
            assert client.returncode == 0, err
            times[kind].append(json.loads(out.strip().splitlines()[-1]))
    rows = {k: {"median_s": statistics.median(v), "all_s": v} for k, v in times.items()}
    print("\napply() -> ready 2-host mesh (median of", ROUNDS, "rounds)")
    for kind, row in rows.items():
        print(f"  {kind:10s} {row['median_s']:7.2f} s   {[round(t, 2) for t in row['all_s']]}")
    out_dir = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    (out_dir / f"jobs-{stamp}.json").write_text(
        json.dumps({"workload": "apply_to_ready_2_hosts", "python": sys.version, **rows}, indent=1)
    )
