"""Jobs: ``LocalJob`` and ``ProcessJob``, with Monarch's ``apply()`` / ``state()`` / ``kill()``.

A job obtains hosts and hands out one ``HostMesh`` per named mesh::

    job = ProcessJob({"trainers": 2, "dataloaders": 1})
    job.apply()                      # start 3 local worker processes
    trainers = job.state().trainers  # a HostMesh with dimension hosts=2
    ...
    job.kill()
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from .._actor.hosts import HostMesh, attach_to_workers, this_host
from .._transport.auth import new_secret

__all__ = ["JobState", "JobTrait", "LocalJob", "ProcessJob"]

WORKER_START_TIMEOUT = 60.0


_secret_lock = threading.Lock()
_secret: str | None = None


def _job_secret() -> str:
    """The secret this client's jobs share: its own, ``$DANAUS_SECRET``, or one made once.

    A client authenticates with one secret, so every job it starts uses the same.
    """
    global _secret
    from .._runtime import proc as _proc

    rt = _proc.current()
    if rt is not None and rt.secret is not None:
        return rt.secret.decode()
    with _secret_lock:
        if _secret is None:
            _secret = os.environ.get("DANAUS_SECRET") or new_secret()
        return _secret


class JobState:
    """One ``HostMesh`` per named mesh, as attributes (``state.trainers``)."""

    def __init__(self, meshes: Mapping[str, HostMesh]) -> None:
        self._meshes = dict(meshes)
        for name, mesh in meshes.items():
            setattr(self, name, mesh)

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(
            f"this job has no mesh named {name!r}; its meshes are {sorted(self._meshes)}"
        )

    def __repr__(self) -> str:
        return f"JobState({', '.join(f'{k}={v!r}' for k, v in self._meshes.items())})"


class JobTrait:
    """The job API: ``apply()`` obtains the hosts, ``state()`` names them, ``kill()`` ends it."""

    def __init__(self) -> None:
        self._applied = False
        self._state: JobState | None = None

    @property
    def active(self) -> bool:
        return self._applied

    def apply(self, client_script: str | None = None) -> None:
        """Obtain the hosts (a no-op if already applied)."""
        if client_script is not None:
            raise NotImplementedError("batch mode (client_script) is not supported yet")
        if not self._applied:
            self._create()
            self._applied = True

    def state(self, cached_path: str | None = None) -> JobState:
        """The job's meshes; applies the job first if needed."""
        self.apply()
        if self._state is None:
            self._state = JobState(self._meshes())
        return self._state

    def kill(self) -> None:
        """Release the hosts."""
        self._kill()
        self._applied = False
        self._state = None

    def _create(self) -> None:
        raise NotImplementedError

    def _meshes(self) -> dict[str, HostMesh]:
        raise NotImplementedError

    def _kill(self) -> None:
        pass


class LocalJob(JobTrait):
    """Every mesh is this machine (``this_host()``)."""

    def __init__(self, hosts: Sequence[str] = ("hosts",)) -> None:
        super().__init__()
        self._names = list(hosts)

    def _create(self) -> None:
        pass

    def _meshes(self) -> dict[str, HostMesh]:
        return {name: this_host() for name in self._names}


class ProcessJob(JobTrait):
    """Hosts as local ``danaus worker`` processes, for development and tests.

    ``ProcessJob({"trainers": 2})`` starts two workers on 127.0.0.1 with a fresh
    job secret; ``state().trainers`` is a ``HostMesh`` of ``hosts=2``.
    """

    def __init__(self, meshes: Mapping[str, int], env: Mapping[str, str] | None = None) -> None:
        super().__init__()
        for name, n in meshes.items():
            if not name.isidentifier():
                raise ValueError(f"mesh names must be identifiers, got {name!r}")
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"mesh {name!r} needs a host count >= 1, got {n!r}")
        self._spec = dict(meshes)
        self._env = dict(env or {})
        self._secret = _job_secret()
        self._workers: dict[str, list[tuple[subprocess.Popen[str], str]]] = {}

    def _start_worker(self) -> tuple[subprocess.Popen[str], str]:
        env = {
            **os.environ,
            **self._env,
            "DANAUS_SECRET": self._secret,
            "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
        }
        p = subprocess.Popen(
            [sys.executable, "-m", "danaus", "worker", "--listen", "tcp://127.0.0.1:0"],
            stdout=subprocess.PIPE,
            env=env,
            text=True,
            start_new_session=True,
        )
        assert p.stdout is not None
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(p.stdout.readline()), daemon=True)  # type: ignore[union-attr]
        reader.start()
        reader.join(WORKER_START_TIMEOUT)
        if not line or not line[0].startswith("danaus worker listening on "):
            p.kill()
            raise RuntimeError(
                f"a local worker did not start within {WORKER_START_TIMEOUT} s "
                f"(exit code {p.poll()}, said {line[0] if line else ''!r})"
            )
        return p, line[0].split()[-1]

    def _create(self) -> None:
        try:
            for name, n in self._spec.items():
                self._workers[name] = [self._start_worker() for _ in range(n)]
        except BaseException:
            self._kill()
            raise

    def _meshes(self) -> dict[str, HostMesh]:
        return {
            name: attach_to_workers(workers=[addr for _, addr in ws], secret=self._secret)
            for name, ws in self._workers.items()
        }

    def _kill(self) -> None:
        for ws in self._workers.values():
            for p, _ in ws:
                if p.poll() is None:
                    p.kill()
                p.wait()
                if p.stdout is not None:
                    p.stdout.close()
        self._workers.clear()
