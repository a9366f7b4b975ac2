"""Monarch's RDMA ping-pong example runs on danaus with not even its imports changed.

``monarch_examples/rdma_pingpong.py`` is Monarch's file, verbatim. A driver in a
child process puts ``scripts/monarch_conformance/alias`` first on ``sys.path``
(``import monarch.X`` gives ``danaus.X``), replaces the ``SlurmJob`` its ``main``
asks for with a ``ProcessJob`` of two local workers (two hosts for the data plane:
the bytes cross a data connection, staged through pinned memory for
``cuda_tensor``), and calls ``main``. Every ping and pong must print PASS (the
reader's checksum equals the owner's).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = Path(__file__).resolve().parent / "monarch_examples" / "rdma_pingpong.py"
SHIMS = EXAMPLE.parent / "shims"
ALIAS = REPO / "scripts" / "monarch_conformance" / "alias"
ITERATIONS = 2

DRIVER = f"""
import importlib.util, sys
sys.path.insert(0, {str(ALIAS)!r})
for name in ("fire", "xxhash"):
    if importlib.util.find_spec(name) is None:
        sys.path.append({str(SHIMS)!r})
import monarch.job
from danaus.job import ProcessJob

jobs = []

class LocalSlurm(ProcessJob):
    # SlurmJob(meshes=..., gpus_per_node=..., partition=..., ...): two local workers instead
    def __init__(self, meshes, **slurm_options):
        super().__init__(meshes)
        jobs.append(self)

monarch.job.SlurmJob = LocalSlurm
spec = importlib.util.spec_from_file_location("rdma_pingpong", {str(EXAMPLE)!r})
example = importlib.util.module_from_spec(spec)
spec.loader.exec_module(example)
try:
    size, kind = int(sys.argv[2]), sys.argv[1]
    example.main(data_size_mb=size, num_iterations={ITERATIONS}, buffer_type=kind)
finally:
    for job in jobs:
        job.kill()
"""


def _run(buffer_type: str, size_mb: int, tmp_path: Path) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DANAUS_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), env.get("PYTHONPATH", "")])
    env["PYTHONUNBUFFERED"] = "1"
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER, buffer_type, str(size_mb)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=150,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    return proc.stdout


def _check(stdout: str, buffer_type: str) -> None:
    assert f"(buffer_type={buffer_type})" in stdout
    results = [line for line in stdout.splitlines() if line.strip().startswith("[")]
    assert len(results) == 2 * ITERATIONS, stdout
    assert all(line.rstrip().endswith("PASS") for line in results), stdout
    assert stdout.rstrip().endswith("Done!")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("buffer_type", ["cpu_tensor", "bytearray"])
def test_monarchs_rdma_pingpong_runs_with_host_memory(buffer_type: str, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    _check(_run(buffer_type, 4, tmp_path), buffer_type)


@pytest.mark.gpu
@pytest.mark.timeout(180)
def test_monarchs_rdma_pingpong_runs_with_cuda_tensors(tmp_path: Path) -> None:
    _check(_run("cuda_tensor", 64, tmp_path), "cuda_tensor")


def test_the_example_is_monarchs_file_verbatim() -> None:
    text = EXAMPLE.read_text()
    assert "from monarch.actor import Actor, endpoint, shutdown_context" in text
    assert "from monarch.rdma import RDMABuffer" in text
    assert "danaus" not in text
    assert importlib.util.find_spec("danaus") is not None
