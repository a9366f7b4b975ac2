"""Running without a secret is said on the user's terminal: by a worker that detaches
(how SSHJob and ProcessJob start them) and by the client (issue 26, F6)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from danaus.testing import ClientScript, client_env

pytestmark = pytest.mark.timeout(60)


def _without_secret() -> dict[str, str]:
    env = client_env()
    env.pop("DANAUS_SECRET", None)
    env.pop("DANAUS_INSECURE", None)
    return env


@contextlib.contextmanager
def _detached_insecure_worker(tmp_path: Path) -> Iterator[tuple[str, str, str]]:
    """Start ``danaus worker --insecure --detach``; yields (address, launcher's stderr, log)."""
    log = tmp_path / "worker.log"
    out = subprocess.run(
        [sys.executable, "-m", "danaus", "worker", "--listen", "tcp://127.0.0.1:0",
         "--insecure", "--detach", "--log-file", str(log)],
        env=_without_secret(), capture_output=True, text=True, timeout=50,
    )  # fmt: skip
    assert out.returncode == 0, (out.stdout, out.stderr)
    # danaus worker listening on ADDR pid PID log FILE
    words = out.stdout.split()
    address, pid = words[words.index("on") + 1], int(words[words.index("pid") + 1])
    try:
        yield address, out.stderr, str(log)
    finally:
        os.killpg(pid, signal.SIGKILL)  # the worker leads its own session: it and its procs


def test_a_detached_insecure_worker_warns_on_the_users_terminal(tmp_path: Path) -> None:
    with _detached_insecure_worker(tmp_path) as (_, stderr, log):
        assert "WARNING: --insecure: listening on tcp://127.0.0.1:" in stderr
        assert "anyone who can reach this port can run code" in stderr
        assert "WARNING: --insecure" in Path(log).read_text()  # and in its log, as before


def test_an_insecure_client_warns_on_the_users_terminal(tmp_path: Path) -> None:
    with _detached_insecure_worker(tmp_path) as (address, _, _):
        script = ClientScript(tmp_path).write(
            """
            import sys
            from danaus.actor import attach_to_workers

            hosts = attach_to_workers(workers=[sys.argv[1]])
            print("attached", hosts.initialized.get(timeout=30))
            """
        )
        env = _without_secret()
        env["DANAUS_INSECURE"] = "1"
        out = subprocess.run(
            [sys.executable, str(script), address], env=env, capture_output=True, text=True,
            timeout=50,
        )  # fmt: skip
    assert "attached True" in out.stdout, (out.stdout, out.stderr[-3000:])
    assert "WARNING: DANAUS_INSECURE=1" in out.stderr, out.stderr[-3000:]
    assert "tcp://127.0.0.1:" in out.stderr and "can run code" in out.stderr
