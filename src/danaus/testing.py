"""``danaus.testing``: helpers for testing programs built on danaus.

``FaultRecorder`` stands in for ``danaus.actor.unhandled_fault_hook`` (whose
default ends the program) and lets a test wait for failures with a timeout:

    recorder = FaultRecorder()
    danaus.actor.unhandled_fault_hook = recorder
    ...
    recorder.crashed("workers", {2})     # exactly rank 2 of "workers" failed

``SimulatedMesh`` builds an actor mesh of thousands of in-process procs
(real runtimes over the ``inproc`` transport, sharing one thread), for tests
and benchmarks of sizes real processes cannot reach on one machine:

    with SimulatedMesh(Counter, {"hosts": 256, "gpus": 16}) as sim:
        sim.mesh.incr.broadcast()

``ClientScript`` runs a client program in its own interpreter (for what a
test process cannot do to itself: exit codes, ``kill -9``, at-exit handlers),
and ``pid_alive`` / ``wait_pids_gone`` check that processes really went away;
``freeze`` stops one (SIGSTOP) and waits until it really has.

``wait_until`` polls, with a deadline, a state that nothing announces (another
process's, a file's); where an event, future or queue announces it, wait on
that instead:

    wait_until(lambda: not os.path.exists(path), timeout=20, what=f"{path} is removed")
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from ._actor.tools.simulated import SimulatedMesh
from ._runtime.messaging.liveness import pid_exists
from ._supervision.failure import MeshFailure

__all__ = [
    "ClientScript",
    "FaultRecorder",
    "SimulatedMesh",
    "client_env",
    "freeze",
    "pid_alive",
    "wait_pids_gone",
    "wait_until",
]

T = TypeVar("T")

_SRC = str(Path(__file__).resolve().parents[1])  # the danaus this process imports


def pid_alive(pid: int) -> bool:
    """True while ``pid`` is a live process (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except FileNotFoundError:
        return False
    except OSError:  # no procfs: ask the kernel
        return pid_exists(pid)
    # The state follows the parenthesised command name, which may contain spaces.
    return stat[stat.rindex(")") + 2] not in "ZX"


def wait_pids_gone(pids: Iterable[int], timeout: float = 20.0) -> list[int]:
    """Poll (bounded) until none of ``pids`` is alive; returns those still alive."""
    pids = list(pids)
    deadline = time.monotonic() + timeout
    while True:
        alive = [p for p in pids if pid_alive(p)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.02)  # polling an external condition (process exit), with a deadline


def freeze(pid: int, timeout: float = 20.0) -> None:
    """SIGSTOP process ``pid`` and return once every thread of it has stopped.

    ``kill`` only starts a group stop: until the kernel has stopped each
    thread, a running one (an actor spinning for its next call, say) may
    still read a message sent meanwhile and answer it. Raises
    ``AssertionError`` if the process is gone or not stopped in ``timeout`` s.
    Resume it with ``os.kill(pid, signal.SIGCONT)``.
    """
    try:
        os.kill(pid, signal.SIGSTOP)
    except ProcessLookupError:
        raise AssertionError(f"process {pid} is gone") from None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except FileNotFoundError:
            raise AssertionError(f"process {pid} is gone") from None
        states = []
        for task in tasks:
            try:
                with open(f"/proc/{pid}/task/{task}/stat") as f:
                    states.append(f.read().rpartition(")")[2].split()[0])
            except OSError:  # that thread just ended
                pass
        if states and all(state in "tT" for state in states):
            return
        time.sleep(0.001)  # polling the kernel's view of another process, with a deadline
    raise AssertionError(f"process {pid} did not stop within {timeout} s")


def client_env() -> dict[str, str]:
    """This process's environment, set up so a child interpreter imports the same danaus."""
    env = dict(os.environ)
    parts = [_SRC, *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env["PYTHONUNBUFFERED"] = "1"
    return env


class ClientScript:
    """Writes client scripts into a directory and runs them in their own interpreter.

    ``run`` waits for the script (bounded by ``timeout``); ``start`` returns the
    running process, talking over stdin/stdout; ``close`` kills what still runs.
    """

    def __init__(self, directory: Path) -> None:
        self.tmp_path = Path(directory)
        self._running: list[subprocess.Popen[str]] = []

    def write(self, source: str, name: str = "client.py") -> Path:
        path = self.tmp_path / name
        path.write_text(textwrap.dedent(source))
        return path

    def run(
        self, source: str, name: str = "client.py", timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        path = self.write(source, name)
        return subprocess.run(
            [sys.executable, str(path)],
            cwd=self.tmp_path,
            env=client_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def start(self, source: str, name: str = "client.py") -> subprocess.Popen[str]:
        path = self.write(source, name)
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


DEFAULT_TIMEOUT = 20.0


def wait_until(
    probe: Callable[[], T],
    timeout: float = DEFAULT_TIMEOUT,
    what: str = "the condition",
    *,
    until: Callable[[T], Any] = bool,
    interval: float = 0.01,
) -> T:
    """Call ``probe()`` every ``interval`` s until ``until(value)`` holds; return that value.

    Raises ``AssertionError`` naming ``what`` and the last value seen if it
    does not hold within ``timeout`` s; exceptions from ``probe`` propagate.
    ``interval=0`` spins without sleeping (to catch a state that lasts briefly).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if until(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout} s waiting for: {what} (last value: {value!r})"
            )
        if interval:
            time.sleep(interval)  # polling a state nothing announces, with a deadline


class FaultRecorder:
    """Records the failures that reach the client; tests wait for them (never sleep).

    Every ``wait*`` raises ``AssertionError`` naming what arrived if the
    condition does not hold within ``timeout`` seconds, and marks all failures
    so far as seen; ``unseen()`` lists those no test waited for.
    """

    def __init__(self) -> None:
        self.events: list[MeshFailure] = []
        self._seen = 0
        self._cond = threading.Condition()  # guards events and _seen; notified on each event

    def __call__(self, failure: MeshFailure) -> None:
        with self._cond:
            self.events.append(failure)
            self._cond.notify_all()

    def wait_until(
        self,
        done: Callable[[list[MeshFailure]], bool],
        what: str,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> list[MeshFailure]:
        """Block until ``done(all failures so far)``; return them all."""
        with self._cond:
            if not self._cond.wait_for(lambda: done(self.events), timeout):
                raise AssertionError(
                    f"expected {what} to reach the client within {timeout} s, got "
                    f"{[str(e) for e in self.events]}"
                )
            self._seen = len(self.events)
            return list(self.events)

    def wait(self, n: int = 1, timeout: float = DEFAULT_TIMEOUT) -> list[MeshFailure]:
        """Block until ``n`` failures arrived in all; return them all."""
        return self.wait_until(lambda events: len(events) >= n, f"{n} failure(s)", timeout)

    def wait_for(
        self,
        pred: Callable[[list[MeshFailure]], bool],
        what: str,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> list[MeshFailure]:
        """Block until ``pred(failures not yet seen)`` holds; return those."""
        with self._cond:
            ok = self._cond.wait_for(lambda: pred(self.events[self._seen :]), timeout)
            new = self.events[self._seen :]
            if not ok:
                raise AssertionError(
                    f"expected {what} to reach the client within {timeout} s; got "
                    f"{[str(e) for e in new]}"
                )
            self._seen = len(self.events)
            return new

    def crashed(
        self, mesh_name: str, ranks: set[int], timeout: float = DEFAULT_TIMEOUT
    ) -> list[MeshFailure]:
        """Wait for failures of exactly ``ranks`` of ``mesh_name``, and of nothing else."""

        def got(events: list[MeshFailure]) -> bool:
            return {r for e in events if e.mesh_name == mesh_name for r in e.crashed_ranks} >= ranks

        events = self.wait_for(got, f"failures of {mesh_name}{sorted(ranks)}", timeout)
        # Raised, not asserted: the check holds under ``python -O`` too.
        crashed = sorted(r for e in events for r in e.crashed_ranks)
        if {e.mesh_name for e in events} != {mesh_name} or crashed != sorted(ranks):
            raise AssertionError(
                f"expected failures of exactly {mesh_name}{sorted(ranks)}; got "
                f"{[str(e) for e in events]}"
            )
        return events

    def mark_seen(self) -> None:
        with self._cond:
            self._seen = len(self.events)

    def unseen(self) -> list[MeshFailure]:
        """The failures no ``wait*`` has returned yet."""
        with self._cond:
            return self.events[self._seen :]
