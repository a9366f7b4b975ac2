"""Fixtures for the supervision tests: a recording fault hook, fresh procs, client scripts.

The default ``danaus.actor.unhandled_fault_hook`` ends the process, which here
would end pytest. Every test gets a :class:`FaultRecorder` instead (installed
by assignment, the public way), waits for the failures it causes with bounded
waits, and fails at teardown if a failure arrived that it did not wait for.

Most tests here break things, so they spawn their own procs through
``spawn_procs``, which stops them all at teardown (a dead proc counts as
stopped).
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

import danaus.actor
from danaus.actor import Actor, MeshFailure, ProcMesh, endpoint, this_host
from danaus.testing import FaultRecorder

REPO = Path(__file__).resolve().parents[2]
# Subprocess clients import the same danaus as this test run.
SRC = Path(danaus.actor.__file__).resolve().parents[1]

# Bound on any single wait: far above what a healthy call or failure report needs.
TIMEOUT = 20.0


@pytest.fixture(autouse=True)
def faults(monkeypatch: pytest.MonkeyPatch) -> Iterable[FaultRecorder]:
    recorder = FaultRecorder()
    monkeypatch.setattr(danaus.actor, "unhandled_fault_hook", recorder)
    yield recorder
    extra = recorder.unseen()
    if extra:
        pytest.fail(f"unexpected failure(s) reached the client: {[str(f) for f in extra]}")


@pytest.fixture
def spawn_procs() -> Iterable[Callable[..., ProcMesh]]:
    """``spawn_procs(gpus=2)``: fresh procs, booted, stopped at teardown."""
    spawned: list[ProcMesh] = []

    def spawn(**per_host: int) -> ProcMesh:
        pm = this_host().spawn_procs(per_host=per_host or {"gpus": 1})
        spawned.append(pm)
        assert pm.initialized.get(timeout=TIMEOUT) is True
        return pm

    yield spawn
    for pm in spawned:
        pm.stop().get(timeout=TIMEOUT)


# -- processes ------------------------------------------------------------------


def pid_alive(pid: int) -> bool:
    """True while ``pid`` is a live process (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


def wait_pids_gone(pids: Iterable[int], timeout: float = TIMEOUT) -> list[int]:
    """Poll (bounded) until none of ``pids`` is alive; returns those still alive."""
    pids = list(pids)
    deadline = time.monotonic() + timeout
    while True:
        alive = [p for p in pids if pid_alive(p)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.02)  # polling an external condition (process exit), with a deadline


def client_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(SRC), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    )
    env["PYTHONUNBUFFERED"] = "1"
    return env


class ClientScript:
    """Runs client scripts (written into ``tmp_path``) in their own interpreter."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self._running: list[subprocess.Popen[str]] = []

    def _write(self, source: str, name: str) -> Path:
        path = self.tmp_path / name
        path.write_text(textwrap.dedent(source))
        return path

    def run(
        self, source: str, name: str = "client.py", timeout: float = 40.0
    ) -> subprocess.CompletedProcess[str]:
        path = self._write(source, name)
        return subprocess.run(
            [sys.executable, str(path)],
            cwd=self.tmp_path,
            env=client_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def start(self, source: str, name: str = "client.py") -> subprocess.Popen[str]:
        """Start a client; it talks to the test over stdin/stdout, line by line."""
        path = self._write(source, name)
        p = subprocess.Popen(
            [sys.executable, str(path)],
            cwd=self.tmp_path,
            env=client_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._running.append(p)
        return p

    def close(self) -> None:
        for p in self._running:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
            p.wait()
            for stream in (p.stdin, p.stdout, p.stderr):
                if stream is not None:
                    stream.close()


@pytest.fixture
def client_script(tmp_path: Path) -> Iterable[ClientScript]:
    cs = ClientScript(tmp_path)
    yield cs
    cs.close()


class Lines:
    """Reads a subprocess's stdout on a thread, so tests can wait for a line with a timeout."""

    def __init__(self, p: subprocess.Popen[str]) -> None:
        self._q: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        assert p.stdout is not None
        stream = p.stdout

        def pump() -> None:
            for line in stream:
                self._q.put(line.rstrip("\n"))
            self._q.put(None)

        threading.Thread(target=pump, daemon=True).start()

    def expect(self, prefix: str, timeout: float = TIMEOUT) -> str:
        """The next line starting with ``prefix`` (others are kept in ``seen``)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._q.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(
                    f"no line {prefix!r} within {timeout} s; saw {self.seen}"
                ) from None
            if line is None:
                raise AssertionError(
                    f"the client ended before printing {prefix!r}; saw {self.seen}"
                )
            self.seen.append(line)
            if line.startswith(prefix):
                return line[len(prefix) :].strip()


# -- settling: proving that no (more) failure reached the client ---------------------


class Sentinel(Actor):
    @endpoint
    def fail(self) -> None:
        raise RuntimeError("sentinel failure")


def settle(faults: FaultRecorder, pm: ProcMesh) -> list[MeshFailure]:
    """The failures that reached the client and were not yet seen (the sentinel's excepted).

    Fails a fresh client-owned sentinel actor and waits for its report: the
    hook takes failures one at a time in the order they reached the client, so
    anything that had reached it before is delivered by then. Call it after a
    round trip that orders the failure you are ruling out before it.
    """
    start = len(faults.events) - len(faults.unseen())
    sentinel = pm.slice(**{k: 0 for k in pm.extent.labels}).spawn("sentinel", Sentinel)
    sentinel.initialized.get(timeout=TIMEOUT)
    sentinel.fail.broadcast()
    events = faults.wait_until(
        lambda events: any(e.mesh_name == "sentinel" for e in events[start:]), "the sentinel"
    )
    return [e for e in events[start:] if e.mesh_name != "sentinel"]
