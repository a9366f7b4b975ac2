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
from typing import Any

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
    _save("apply_to_ready_2_hosts", rows)


SYNC_CLIENT = """
    import json, shutil, sys, time
    from pathlib import Path
    from danaus.actor import attach_to_workers
    from danaus.tools.config import Workspace

    rounds = int(sys.argv[3])
    tree = Path("tree")
    for d in range(50):  # 1,000 files of about 2 KiB in 50 packages
        pkg = tree / f"pkg{d:02d}"
        pkg.mkdir(parents=True)
        for f in range(20):
            n = d * 20 + f
            body = "".join(f"def f{i}(x):\\n    return x * {i} + {n}\\n" for i in range(40))
            (pkg / f"mod{f:02d}.py").write_text(body)
    hosts = attach_to_workers(workers=sys.argv[1].split(","), secret=sys.argv[2])
    hosts.initialized.get(timeout=60)
    times = {"copytree (local, 1 copy)": [], "first": [], "unchanged": [], "one file changed": []}
    for r in range(rounds):
        t0 = time.perf_counter()
        shutil.copytree(tree, f"copy{r}")
        times["copytree (local, 1 copy)"].append(time.perf_counter() - t0)
        ws = Workspace(dirs={tree: f"round{r}"})  # a fresh remote directory: a full copy
        t0 = time.perf_counter()
        first = hosts.sync_workspace(ws).get(timeout=300)
        times["first"].append(time.perf_counter() - t0)
        assert first.files_sent == 2000, first
        t0 = time.perf_counter()
        same = hosts.sync_workspace(ws).get(timeout=300)
        times["unchanged"].append(time.perf_counter() - t0)
        assert same.files_sent == 0, same
        (tree / "pkg07" / "mod03.py").write_text(f"VALUE = {r}\\n")
        t0 = time.perf_counter()
        one = hosts.sync_workspace(ws).get(timeout=300)
        times["one file changed"].append(time.perf_counter() - t0)
        assert one.files_sent == 2, one
    print(json.dumps(times), flush=True)
    hosts.stop().get(timeout=30)  # the workers stay for the next test's client
"""


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_bench_sync_workspace_of_1000_files(
    private_hosts: dict[str, Any], scripts: Scripts
) -> None:
    path = scripts.write(SYNC_CLIENT)
    client = scripts.start_path(
        path, ",".join(private_hosts["workers"]), private_hosts["secret"], str(ROUNDS)
    )
    out, err = client.communicate(timeout=540)
    assert client.returncode == 0, err
    times: dict[str, list[float]] = json.loads(out.strip().splitlines()[-1])
    rows = {k: {"median_s": statistics.median(v), "all_s": v} for k, v in times.items()}
    first = rows["first"]["median_s"]
    print(f"\nsync_workspace of 1,000 files (~2 KiB) to 2 namespace hosts (median of {ROUNDS})")
    for kind, row in rows.items():
        ratio = row["median_s"] / first
        print(f"  {kind:26s} {row['median_s'] * 1000:8.1f} ms  {ratio:6.3f}x first")
    _save("sync_workspace_1000_files", rows)


def _save(workload: str, rows: dict[str, Any]) -> None:
    out_dir = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    (out_dir / f"jobs-{workload}-{stamp}.json").write_text(
        json.dumps({"workload": workload, "python": sys.version, **rows}, indent=1)
    )
