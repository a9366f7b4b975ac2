"""Shared helpers for the job tests: free ports, local workers, client scripts."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from danaus.testing import ClientScript, client_env

TIMEOUT = 30.0


def free_port() -> int:
    """A TCP port nothing listens on right now (on 127.0.0.1)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Scripts(ClientScript):
    """``ClientScript`` whose scripts also take command-line arguments."""

    def start_path(self, path: Path, *args: str) -> subprocess.Popen[str]:
        p = subprocess.Popen(
            [sys.executable, str(path), *args],
            cwd=self.tmp_path,
            env=client_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._running.append(p)
        return p


@pytest.fixture
def scripts(tmp_path: Path) -> Iterator[Scripts]:
    cs = Scripts(tmp_path)
    yield cs
    cs.close()


@pytest.fixture
def job_secret() -> str:
    return secrets.token_hex(32)


class LocalWorker:
    """``danaus worker`` on 127.0.0.1, started by a test, killed at teardown."""

    def __init__(self, port: int, secret: str) -> None:
        env = {**client_env(), "DANAUS_SECRET": secret}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "danaus", "worker", "--listen", f"tcp://127.0.0.1:{port}"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        assert self.proc.stdout is not None
        self.line = self.proc.stdout.readline()  # bounded by the test's timeout

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(TIMEOUT)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture
def local_workers() -> Iterator[list[LocalWorker]]:
    started: list[LocalWorker] = []
    yield started
    for w in started:
        w.kill()
