"""Shared fixtures for the multi-process integration tests.

Meshes are spawned once and shared where the semantics allow: ``procs`` (two
procs, ``{"gpus": 2}``) lives for the whole session. Tests that stop or break
things spawn their own.

Cross-process synchronisation never uses sleeps. ``latch`` gives two actor
meshes on the shared procs: ``waiters.wait(key, timeout)`` blocks on a
``threading.Event`` that lives in the proc (module global), and
``releasers.release(key)`` — a *different* actor in the same proc — sets it.
Every wait is bounded, so a deadlock shows up as a ``TimeoutError``, not a hang.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

import danaus.actor as danaus_actor
from danaus.actor import Actor, ProcMesh, endpoint, this_host

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src"

# Bounded wait for any single reply in these tests: far above what a healthy call needs.
REPLY_TIMEOUT = 30.0


# -- failures that reach the client ------------------------------------------------
#
# By default an unhandled actor failure ends the client (exit code 1), which here
# would end the whole pytest run. Record them instead and fail the test during
# which they arrived; no test in this suite is meant to cause one.

_faults: list[Any] = []


@pytest.fixture(scope="session", autouse=True)
def _record_unhandled_faults() -> Iterable[list[Any]]:
    if not hasattr(danaus_actor, "unhandled_fault_hook"):
        yield _faults
        return
    previous = danaus_actor.unhandled_fault_hook
    danaus_actor.unhandled_fault_hook = _faults.append
    yield _faults
    danaus_actor.unhandled_fault_hook = previous


@pytest.fixture(autouse=True)
def _no_unhandled_faults(_record_unhandled_faults: list[Any]) -> Iterable[None]:
    seen = len(_record_unhandled_faults)
    yield
    new = _record_unhandled_faults[seen:]
    if new:
        pytest.fail(f"{len(new)} unhandled failure(s) reached the client: {[str(f) for f in new]}")


# -- a latch usable across actors of one proc ---------------------------------

_LATCHES: dict[str, threading.Event] = {}
_LATCHES_LOCK = threading.Lock()


def _latch_event(key: str) -> threading.Event:
    with _LATCHES_LOCK:
        return _LATCHES.setdefault(key, threading.Event())


class Latch(Actor):
    """``wait(key)`` blocks this actor until another actor of its proc calls ``release(key)``."""

    @endpoint
    def wait(self, key: str, timeout: float = REPLY_TIMEOUT) -> bool:
        return _latch_event(key).wait(timeout)

    @endpoint
    def release(self, key: str) -> None:
        _latch_event(key).set()

    @endpoint
    def pid(self) -> int:
        return os.getpid()


class LatchPair:
    """Two meshes of :class:`Latch` on the same procs, and fresh keys.

    Every key handed out is released when the test ends, so a test that fails
    while an actor waits does not leave that actor blocked for later tests.
    """

    def __init__(self, waiters: Any, releasers: Any) -> None:
        self.waiters = waiters
        self.releasers = releasers
        self.keys: list[str] = []

    def key(self) -> str:
        key = uuid.uuid4().hex
        self.keys.append(key)
        return key

    def release(self, key: str, **where: int) -> None:
        mesh = self.releasers.slice(**where) if where else self.releasers
        mesh.release.call(key).get(timeout=REPLY_TIMEOUT)

    def release_all(self) -> None:
        for key in self.keys:
            with contextlib.suppress(Exception):
                self.release(key)

    def __reduce__(self) -> Any:
        return (LatchPair, (self.waiters, self.releasers))


@pytest.fixture(scope="session")
def procs() -> Iterable[ProcMesh]:
    """Two procs, ``{"gpus": 2}``, shared by every test that does not stop or break them."""
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    assert pm.initialized.get(timeout=REPLY_TIMEOUT) is True
    yield pm
    pm.stop().get(timeout=REPLY_TIMEOUT)


@pytest.fixture(scope="session")
def _latch_meshes(procs: ProcMesh) -> tuple[Any, Any]:
    waiters = procs.spawn("latch_waiters", Latch)
    releasers = procs.spawn("latch_releasers", Latch)
    waiters.initialized.get(timeout=REPLY_TIMEOUT)
    releasers.initialized.get(timeout=REPLY_TIMEOUT)
    return waiters, releasers


@pytest.fixture
def latch(_latch_meshes: tuple[Any, Any]) -> Iterable[LatchPair]:
    pair = LatchPair(*_latch_meshes)
    yield pair
    pair.release_all()


# -- processes ------------------------------------------------------------------


def pid_alive(pid: int) -> bool:
    """True while ``pid`` is a live process (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    # The state follows the parenthesised command name, which may contain spaces.
    return stat[stat.rindex(")") + 2] not in "ZX"


def wait_pids_gone(pids: Iterable[int], timeout: float = 10.0) -> list[int]:
    """Poll (bounded) until none of ``pids`` is alive; returns those still alive."""
    pids = list(pids)
    deadline = time.monotonic() + timeout
    while True:
        alive = [p for p in pids if pid_alive(p)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.02)  # polling an external condition (process exit), with a deadline


@pytest.fixture
def pids_gone() -> Callable[..., list[int]]:
    return wait_pids_gone


def client_env() -> dict[str, str]:
    env = dict(os.environ)
    parts = [str(SRC), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env["PYTHONUNBUFFERED"] = "1"
    return env


class ClientScript:
    """Writes a client script into ``tmp_path`` and runs it with this interpreter."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self._running: list[subprocess.Popen[str]] = []

    def write(self, source: str, name: str = "client.py") -> Path:
        path = self.tmp_path / name
        path.write_text(textwrap.dedent(source))
        return path

    def run(self, source: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        path = self.write(source)
        return subprocess.run(
            [sys.executable, str(path)],
            cwd=self.tmp_path,
            env=client_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def start(self, source: str) -> subprocess.Popen[str]:
        path = self.write(source)
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
