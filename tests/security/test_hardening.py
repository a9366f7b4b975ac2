"""Issue 26, F9: hardening of what danaus hands to other programs.

``SSHJob`` ends ssh's options with ``--`` before the host; ``SlurmJob`` refuses
control characters in whatever goes into its batch script; ``danaus top`` and
``danaus stack`` take the dashboard's token from a file or the environment,
never needing it on the command line (where ``ps`` shows it to every user).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import danaus.dashboard
from danaus.job import SlurmJob, SSHJob
from danaus.testing import client_env

FAKE_SSH = """#!/bin/sh
printf '%s\\n' "$@" > "$(dirname "$0")/argv"
exit 255
"""


def test_ssh_job_puts_the_host_after_a_double_dash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A host that starts with "-" must reach ssh as a destination, never as an option.
    ssh = tmp_path / "ssh"
    ssh.write_text(FAKE_SSH)
    ssh.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    host = "-oProxyCommand=touch pwned@127.0.0.1"
    with pytest.raises(RuntimeError, match="could not start a worker"):
        SSHJob([host], ssh_args=["-p", "2222"]).apply()
    argv = (tmp_path / "argv").read_text().splitlines()
    assert argv[argv.index(host) - 1] == "--"
    assert argv[: argv.index("--")] == ["-p", "2222", "-o", "BatchMode=yes"]


@pytest.mark.parametrize(
    "field",
    ["partition", "account", "qos", "mem", "time_limit", "log_dir", "python_exe", "job_name"],
)
@pytest.mark.parametrize("bad", ["gpu\ntouch /tmp/pwned", "gpu\rx", "gpu\x00x", "gpu\x1bx"])
def test_slurm_job_refuses_control_characters_in_its_batch_script(field: str, bad: str) -> None:
    with pytest.raises(ValueError, match=rf"^{field} must be"):
        SlurmJob({"hosts": 1}, **{field: bad})  # type: ignore[arg-type]


def test_slurm_job_refuses_them_in_slurm_args_and_words_with_spaces() -> None:
    with pytest.raises(ValueError, match="slurm_args must be one sbatch option"):
        SlurmJob({"hosts": 1}, slurm_args=["--reservation=x\rtouch /tmp/pwned"])
    with pytest.raises(ValueError, match=r"^partition must be one word"):
        SlurmJob({"hosts": 1}, partition="gpu --qos=high")
    job = SlurmJob({"hosts": 1}, partition="gpu", time_limit=60, mem="16G", log_dir="/a b")
    assert "#SBATCH --time=60\n#SBATCH --partition=gpu\n" in job.batch_script()


@pytest.fixture(scope="module")
def dashboard() -> Iterator[danaus.dashboard.Dashboard]:
    dash = danaus.dashboard.serve()
    yield dash
    dash.stop()


def _danaus(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "danaus", *args],
        env={**client_env(), **(env or {})},
        capture_output=True,
        text=True,
        timeout=90,
    )


def test_top_and_stack_take_the_token_from_the_environment_or_a_file(
    dashboard: danaus.dashboard.Dashboard, tmp_path: Path
) -> None:
    url = f"http://127.0.0.1:{dashboard.port}/"  # no token in argv
    out = _danaus("top", "--once", "--url", url, env={"DANAUS_DASHBOARD_TOKEN": dashboard.token})
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("danaus top - client ") and "warning" not in out.stderr
    token = tmp_path / "token"
    token.write_text(dashboard.token + "\n")
    token.chmod(0o600)
    out = _danaus("stack", "no_such_mesh", "--url", url, "--token-file", str(token))
    assert out.returncode == 2 and "no mesh 'no_such_mesh'" in out.stderr  # it got past the token
    token.chmod(0o644)
    out = _danaus("top", "--once", "--url", url, "--token-file", str(token))
    assert out.returncode == 2 and "chmod 600" in out.stderr


def test_top_without_a_token_says_where_to_put_it(dashboard: danaus.dashboard.Dashboard) -> None:
    out = _danaus("top", "--once", "--url", f"http://127.0.0.1:{dashboard.port}/")
    assert out.returncode == 2
    assert "carries no token" in out.stderr and "DANAUS_DASHBOARD_TOKEN" in out.stderr
    assert "--token-file" in out.stderr
    out = _danaus("top", "--once", "--url", dashboard.url)  # the old way still works, warned
    assert out.returncode == 0 and "the token in --url is visible" in out.stderr
