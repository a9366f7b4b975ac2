"""The README's "On a Slurm cluster" section works as written, on the tests' Slurm cluster."""

from __future__ import annotations

import os
import re
import subprocess
import sysconfig
from pathlib import Path

import pytest

from .conftest import Slurm, wait_until

ROOT = Path(__file__).resolve().parents[2]


def _section() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("## On a Slurm cluster")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def _blocks(section: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}[^\n]*\n(.*?)```", section, re.S)


@pytest.mark.timeout(180)
def test_the_readme_slurm_section_runs_as_written(slurm: Slurm, tmp_path: Path) -> None:
    section = _section()
    job_file, use = _blocks(section, "python")
    (commands,) = _blocks(section, "sh")
    (tmp_path / "myjob.py").write_text(job_file)
    # "In the repository with .venv set up": the environment running these tests stands in
    # for it (its scripts directory has the python and danaus the README's commands run).
    (tmp_path / ".venv").symlink_to(Path(sysconfig.get_path("scripts")).parent)
    env = {k: v for k, v in os.environ.items() if k != "DANAUS_SECRET"}
    outputs = []
    for line in commands.splitlines():
        cmd = line.split("#", 1)[0].strip()
        if not cmd:
            continue
        out = subprocess.run(
            cmd, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
        )
        assert out.returncode == 0, f"{cmd}: {out.stderr}"
        outputs.append(out.stdout)
        if cmd.endswith("apply myjob.py:job"):
            # The Python way reconnects to the applied job through .danaus/job_state.json.
            client = use + "\nprint(procs.sizes)\n"
            py = subprocess.run(
                [".venv/bin/python", "-c", client],
                cwd=tmp_path,
                env={**env, "PYTHONPATH": str(tmp_path)},
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert py.returncode == 0, py.stderr
            assert py.stdout.strip() == "{'hosts': 2, 'gpus': 8}"
    applied, hostnames, killed = outputs
    assert "trainers: <HostMesh {'hosts': 2}> ready" in applied
    assert [line.split()[0] for line in hostnames.splitlines()] == ["[hosts=0]", "[hosts=1]"]
    assert "killed" in killed
    wait_until(lambda: not slurm.jobs(), "the README's job leaving the queue")
