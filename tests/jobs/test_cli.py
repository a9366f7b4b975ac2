"""``danaus apply``, ``danaus exec`` and ``danaus kill``: each a client of its own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from danaus.job import job_load
from danaus.testing import client_env, wait_pids_gone

JOBFILE = """\
from danaus.job import ProcessJob

job = ProcessJob({"hosts": 2})
"""


def danaus(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "danaus", *args],
        cwd=cwd,
        env=client_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_apply_exec_kill_drive_one_job_from_separate_commands(tmp_path: Path) -> None:
    (tmp_path / "myjob.py").write_text(JOBFILE)
    applied = danaus(tmp_path, "apply", "myjob.py:job")
    assert applied.returncode == 0, applied.stderr
    assert "hosts: <HostMesh {'hosts': 2}> ready" in applied.stdout
    saved = job_load(str(tmp_path / ".danaus" / "job_state.json"))
    pids = [w.pid for w in saved.workers["hosts"]]  # type: ignore[attr-defined]

    echo = (
        'echo "$DANAUS_RANK_HOSTS/$DANAUS_SIZE_HOSTS $DANAUS_RANK_GPUS/$DANAUS_SIZE_GPUS '
        '$DANAUS_RANK"'
    )
    every = danaus(tmp_path, "exec", "--all", "--per-host", "gpus=2", "--", "sh", "-c", echo)
    assert every.returncode == 0, every.stderr
    assert every.stdout.splitlines() == [
        "[hosts=0,gpus=0] 0/2 0/2 0",
        "[hosts=0,gpus=1] 0/2 1/2 1",
        "[hosts=1,gpus=0] 1/2 0/2 2",
        "[hosts=1,gpus=1] 1/2 1/2 3",
    ]
    rank = ["sh", "-c", "echo rank $DANAUS_RANK of $DANAUS_SIZE"]
    one = danaus(tmp_path, "exec", "--", *rank)  # --one is the default
    assert one.returncode == 0, one.stderr
    assert one.stdout.splitlines() == ["[hosts=0] rank 0 of 2"]
    explicit = danaus(tmp_path, "exec", "--one", "--per-host", "gpus=2", "--", *rank)
    assert explicit.returncode == 0, explicit.stderr
    assert explicit.stdout.splitlines() == ["[hosts=0,gpus=0] rank 0 of 4"]
    point = danaus(tmp_path, "exec", "--point", "hosts=1", "--", "sh", "-c", "echo no >&2; exit 3")
    assert point.returncode == 3
    assert point.stderr.splitlines()[-2:] == ["[hosts=1] no", "[hosts=1] exited with 3"]

    killed = danaus(tmp_path, "kill")
    assert killed.returncode == 0, killed.stderr
    assert wait_pids_gone(pids) == []
    assert not (tmp_path / ".danaus" / "job_state.json").exists()
    again = danaus(tmp_path, "exec", "--", "true")
    assert again.returncode == 2
    assert "no saved job at .danaus/job_state.json: run `danaus apply JOB` first" in again.stderr


def test_help_teaches_each_command_with_examples(tmp_path: Path) -> None:
    top = danaus(tmp_path, "--help")
    assert top.returncode == 0
    for word in ("worker", "apply", "exec", "kill"):
        assert word in top.stdout
    exec_help = danaus(tmp_path, "exec", "--help").stdout
    assert "DANAUS_RANK_<DIM>" in exec_help and "danaus exec --all -- hostname" in exec_help
    assert "FILE.py:NAME" in danaus(tmp_path, "apply", "--help").stdout


def test_bad_command_lines_say_what_is_wrong(tmp_path: Path) -> None:
    (tmp_path / "notajob.py").write_text("job = 3\n")
    bad = danaus(tmp_path, "apply", "notajob.py:job")
    assert bad.returncode == 2 and "notajob.py:job is int, not a danaus job" in bad.stderr
    assert "no command given" in danaus(tmp_path, "exec", "--all").stderr
    # --state defaults to the setting JobTrait.state() uses, so both find the same file.
    assert "the setting job_state_path" in danaus(tmp_path, "kill", "--help").stdout
