"""The multi-host benchmark works: ``benchmarks/multihost_bench.py --smoke`` on danaus.

Tiny sizes on 2 lab hosts (network namespaces) x 2 procs, plus the correctness
run: every workload gives a number, the CPU of the run is accounted, iperf3
measures the same link, and nothing is left behind (namespaces, bridge,
cgroups, processes). No timing is checked: speed goals are ratios read from
the benchmark's own table (benchmarks/RESULTS.md). Monarch is optional and not
installed in CI, so only danaus runs here.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from danaus import _netlab

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks" / "multihost_bench.py"
WORKLOADS = ("spawn", "call_one", "throughput", "gather", "broadcast", "bulk")

pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or os.geteuid() != 0 or shutil.which("ip") is None,
    reason="the host lab needs root and iproute2 on Linux (CI runs as root)",
)


@pytest.mark.timeout(300)
def test_smoke_run_measures_every_workload_across_hosts_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    out = tmp_path / "multihost.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            str(BENCH),
            "--smoke",
            "--systems",
            "danaus",
            "--hosts",
            "2",
            "--procs",
            "2",
            "--big",
            "2x2",
            "--iperf-seconds",
            "1",
            "--json",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
    )
    try:
        text, _ = proc.communicate(timeout=270)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, text[-4000:]
    doc = json.loads(out.read_text())
    assert doc["meta"]["mode"] == "smoke"
    assert doc["meta"]["systems"] == ["danaus"]
    (run,) = doc["runs"]
    rows = {row["workload"]: row for row in run["rows"]}
    cgroup = doc["meta"]["cgroup"]
    for wl in ("attach", *WORKLOADS):
        row = rows[wl]
        assert row.get("error") is None, (wl, row.get("error"))
        assert row["samples"] and all(math.isfinite(s) and s > 0 for s in row["samples"]), wl
        if wl != "attach" and cgroup:
            # the system's processes ran the workload: their CPU is counted
            assert row["cpu_s"] is not None and row["cpu_s"] > 0, (wl, row)
    assert rows["bulk"]["extra"]["bytes"] == 4 << 20
    # the same link measured by iperf3 (installed by scripts/install-services)
    (ip,) = doc["iperf3"]
    if shutil.which("iperf3"):
        assert ip.get("mib_s", 0) > 0, ip
    else:
        assert "install-services" in ip["error"]
    # the correctness run: 4 procs on 2 hosts, each in its host's namespace
    (big,) = doc["big"]
    (row,) = [r for r in big["rows"] if r["workload"] == "correct"]
    assert row["error"] is None and row["extra"]["problems"] == [], row
    assert row["extra"]["procs"] == 4
    # stopping the procs left nothing for the teardown to kill
    assert run["left_in_cgroup_after_workers_stopped"] == 0
    assert big["left_in_cgroup_after_workers_stopped"] == 0
    # the table names each workload and the link it ran on
    for wl in WORKLOADS:
        assert wl in text
    assert "link 10gbit" in text
    # nothing left: the driver's lab and cgroups went with it
    assert not [t for t, pid in _netlab.lab_bridges() if pid == proc.pid]
    for root in (Path("/sys/fs/cgroup/cpuacct"), Path("/sys/fs/cgroup")):
        assert not list(root.glob(f"dnbench-{proc.pid}-*"))
