"""``examples/simulate_training.py`` (the simulator page's worked example) runs as documented."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("torch")

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_the_worked_example_reports_the_step_and_writes_a_trace(tmp_path: pathlib.Path) -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "simulate_training.py"), "--trace", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=50,
        check=True,
    ).stdout
    assert "simulated step:" in out and "1 group(s) of ranks" in out  # all 8 ranks alike
    assert "ranks 0-7 comms: busy" in out
    assert (tmp_path / "trace_0.json").exists()
