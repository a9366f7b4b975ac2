"""``examples/first_training_job.py`` (the tutorial's program) trains, fails, resumes, and
runs unchanged on a ``ProcessJob``'s worker."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.torch

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "first_training_job.py"


def run(where: str, cwd: pathlib.Path) -> list[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    r = subprocess.run(
        [sys.executable, str(EXAMPLE), where],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=170,
        env=env,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return r.stdout.splitlines()


def losses(lines: list[str]) -> list[tuple[int, str]]:
    return [
        (int(line.split()[1].rstrip(":")), line.split()[-1])
        for line in lines
        if line.startswith("step ")
    ]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("where", ["local", "process"])
def test_the_tutorial_trains_recovers_from_the_checkpoint_and_learns(
    where: str, tmp_path: pathlib.Path
) -> None:
    lines = run(where, tmp_path)
    steps = losses(lines)
    # 6 steps, a failure, a resume from the checkpoint of step 4, then steps 5 to 12.
    assert [s for s, _ in steps] == [1, 2, 3, 4, 5, 6, 5, 6, 7, 8, 9, 10, 11, 12]
    assert any(line.startswith("restarted: ") and "simulated fault" in line for line in lines)
    assert "resumed from the checkpoint of step 4" in lines
    # Resumed from the checkpoint, steps 5 and 6 are those of the first run, to the digit.
    assert steps[4:6] == steps[6:8]
    first, last = float(steps[0][1]), float(steps[-1][1])
    assert last < first / 10  # it learns
    assert not (tmp_path / ".danaus").exists()  # the job kept no state behind
