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

import queue
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

import danaus.actor
from danaus.actor import Actor, MeshFailure, ProcMesh, endpoint, this_host
from danaus.testing import (  # noqa: F401  (the tests import these from here)
    ClientScript,
    FaultRecorder,
    client_env,
    pid_alive,
    wait_pids_gone,
)

REPO = Path(__file__).resolve().parents[2]
# Subprocess clients import the same danaus as this test run.

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
