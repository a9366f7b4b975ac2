"""``scripts/gpu-check`` runs end to end where CUDA is absent and says so in its summary.

On this machine (no GPU) every ``gpu`` test is skipped with a reason and the bench
measures nothing; the script must still run each stage and print its JSON summary
last, which is what a session with a lent GPU reads. Nothing here is timed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu-check"


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.mark.timeout(240)
def test_gpu_check_without_cuda_skips_everything_and_prints_its_summary_last(
    tmp_path: Path,
) -> None:
    if _cuda():
        pytest.skip("this machine has CUDA: scripts/gpu-check is the real check here")
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    env["GPU_CHECK_PYTHON"] = sys.executable
    out = tmp_path / "summary.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=220,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary == json.loads(out.read_text())
    assert summary["cuda"] is False and summary["ok"] is True
    assert "CUDA is absent" in summary["note"]
    tests = summary["tests"]
    assert "tests/rdma/test_cuda.py" in tests["files"]
    assert tests["skipped"] > 0 and tests["passed"] == 0 and tests["failed"] == 0
    assert all("needs CUDA" in why for why in tests["skip_reasons"])
    bench = summary["bench"]
    assert bench["rc"] == 0 and bench["result"]["cuda"] is False
    assert "CUDA is absent" in bench["result"]["skipped"]


def test_gpu_check_lists_every_test_file_with_a_gpu_mark() -> None:
    import importlib.machinery
    import importlib.util

    loader = importlib.machinery.SourceFileLoader("gpu_check", str(SCRIPT))
    spec = importlib.util.spec_from_loader("gpu_check", loader)
    assert spec is not None
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    files = mod.gpu_test_files()
    mark = "pytest.mark." + "gpu"  # spelled apart: this file holds no gpu test
    marked = sorted(
        str(p.relative_to(REPO))
        for p in (REPO / "tests").rglob("test_*.py")
        if mark in p.read_text()
    )
    assert "tests/rdma/test_cuda.py" in marked
    assert files == marked


@pytest.mark.timeout(120)
def test_the_gpu_bench_flow_runs_on_host_memory(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "bench.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DANAUS_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gpu_bench.py"), "--cpu-smoke",
         "--sizes", "1", "--json", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=100,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    row = result["figures"]["1"]
    assert row["ipc"] > 0 and row["staged"] > 0 and row["ipc_backend"] == "process_vm"
    sync = result["figures"]["weight_sync"]
    assert sync["bytes"] == 4 << 20 and sync["gbps"] > 0
