"""Shared helpers for the job tests: free ports, local workers, client scripts."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import pytest

from danaus.testing import ClientScript, client_env

TIMEOUT = 30.0
# Services die with pytest even if it is killed without its teardown (SIGKILL on parent death).
SETPRIV = shutil.which("setpriv")
DIE_WITH_PYTEST = [SETPRIV, "--pdeathsig", "KILL", "--"] if SETPRIV else []


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


# -- OpenSSH -------------------------------------------------------------------------

INSTALL_HINT = "run `sudo scripts/install-services` (installs openssh-server, slurm-wlm, munge)"


def need(binary: str, package: str) -> str:
    """The path of ``binary``; fails the test (never skips) when it is missing."""
    for d in ("", "/usr/sbin/", "/usr/bin/", "/sbin/"):
        path = shutil.which(binary) if not d else d + binary
        if path and os.access(path, os.X_OK):
            return path
    pytest.fail(f"{binary} (Debian package {package}) is not installed: {INSTALL_HINT}")


def read_until(stream: IO[str], wanted: list[str], what: str, limit: int = 200) -> list[str]:
    """Read lines from ``stream`` until each of ``wanted`` occurred in one; fail naming them."""
    seen: list[str] = []
    left = list(wanted)
    while left and len(seen) < limit:
        line = stream.readline()
        if not line:
            break
        seen.append(line.rstrip())
        left = [w for w in left if w not in line]
    if left:
        pytest.fail(f"{what} did not start: it never said {left!r}; it said:\n" + "\n".join(seen))
    return seen


@dataclass
class SSHD:
    """A private sshd on 127.0.0.1 and 127.0.0.2 (``port``) and the ssh options to reach it."""

    port: int
    ssh_args: list[str]
    directory: Path


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SSHD]:
    """An sshd of the session's own: own config, host key and user key, in a temp dir.

    It listens on loopback addresses only, on a free non-default port, and takes
    only the test's key.
    """
    sshd_bin = need("sshd", "openssh-server")
    keygen = need("ssh-keygen", "openssh-client")
    need("ssh", "openssh-client")
    d = tmp_path_factory.mktemp("sshd")
    os.chmod(d, 0o700)
    for name in ("host_key", "user_key"):
        subprocess.run(
            [keygen, "-q", "-t", "ed25519", "-N", "", "-f", str(d / name)],
            check=True,
            capture_output=True,
            timeout=TIMEOUT,
        )
    (d / "authorized_keys").write_text((d / "user_key.pub").read_text())
    port = free_port()
    (d / "sshd_config").write_text(
        textwrap.dedent(
            f"""\
            Port {port}
            ListenAddress 127.0.0.1
            ListenAddress 127.0.0.2
            HostKey {d}/host_key
            PidFile {d}/sshd.pid
            AuthorizedKeysFile {d}/authorized_keys
            PermitRootLogin prohibit-password
            PubkeyAuthentication yes
            PasswordAuthentication no
            KbdInteractiveAuthentication no
            UsePAM no
            StrictModes no
            PrintMotd no
            """
        )
    )
    host_pub = " ".join((d / "host_key.pub").read_text().split()[:2])
    (d / "known_hosts").write_text(f"[127.0.0.1]:{port},[127.0.0.2]:{port} {host_pub}\n")
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation dir
    proc = subprocess.Popen(
        [*DIE_WITH_PYTEST, sshd_bin, "-D", "-e", "-f", str(d / "sshd_config")],
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stderr is not None
    drainer: threading.Thread | None = None
    try:
        read_until(
            proc.stderr,
            [
                f"Server listening on 127.0.0.1 port {port}",
                f"Server listening on 127.0.0.2 port {port}",
            ],
            "sshd",
        )
        drainer = drain(proc.stderr)
        ssh_args = [
            "-F", "/dev/null",
            "-p", str(port),
            "-i", str(d / "user_key"),
            "-o", "IdentitiesOnly=yes",
            "-o", f"UserKnownHostsFile={d}/known_hosts",
            "-o", "StrictHostKeyChecking=yes",
        ]  # fmt: skip
        yield SSHD(port, ssh_args, d)
    finally:
        proc.kill()
        proc.wait(TIMEOUT)
        if drainer is not None:
            drainer.join(TIMEOUT)
        proc.stderr.close()


def drain(stream: IO[str]) -> threading.Thread:
    """Keep reading ``stream`` in the background so its writer never blocks."""
    t = threading.Thread(target=lambda: [None for _ in stream], daemon=True)
    t.start()
    return t
