"""``examples/fault_tolerant_training.py`` runs to the end, recovering from a killed worker."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

from .conftest import REPO, client_env

EXAMPLE = REPO / "examples" / "fault_tolerant_training.py"


def load_example():
    spec = importlib.util.spec_from_file_location("fault_tolerant_training", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fault_tolerant_training_example_recovers_and_prints_the_right_result(tmp_path) -> None:
    example = load_example()
    result = subprocess.run(
        [sys.executable, str(EXAMPLE)],
        cwd=tmp_path,
        env=client_env(),
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert f"final result: {example.expected_total()}" in lines
    killed = f"step {example.KILL_STEP}: killing worker rank {example.KILL_RANK}"
    assert any(line.startswith(killed) for line in lines), result.stdout
    recovered = [line for line in lines if line.startswith("recovered from a failure of")]
    assert len(recovered) == 1, result.stdout
    assert f"rank {example.KILL_RANK}:" in recovered[0] and "SIGKILL" in recovered[0]
    steps = [line for line in lines if line.startswith("step ") and "killing" not in line]
    assert len(steps) == example.STEPS
