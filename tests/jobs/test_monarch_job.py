"""A job class written as Monarch's documentation writes one runs on danaus unchanged.

Monarch's extension points are ``_create(client_script)``, ``_state() -> JobState``,
``can_run(spec)`` and ``_kill()``; its jobs keep plain attributes and expect them
back when a later client reconnects through the cached job state.
"""

from __future__ import annotations

import json
import secrets

import pytest

from danaus.job import JobState, JobTrait, job_loads
from danaus.testing import pid_alive, wait_pids_gone

from .conftest import Scripts

# Only the imports differ from a Monarch job (monarch.actor -> danaus.actor,
# monarch._src.job.job -> danaus.job).
JOB_MODULE = '''
import os
import signal
import socket
import subprocess
import sys
from typing import Optional

from danaus.actor import attach_to_workers
from danaus.job import JobState, JobTrait

WORKER = (
    "import sys; from danaus.actor import run_worker_loop_forever; "
    "run_worker_loop_forever(address=sys.argv[1], ca='trust_all_connections')"
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalWorkersJob(JobTrait):
    """Workers on this machine, started by the job itself."""

    def __init__(self, *, hosts: int = 1, env: Optional[dict[str, str]] = None) -> None:
        super().__init__()
        self._num_hosts = hosts
        self._env = dict(env or {})
        self._workers: Optional[list[str]] = None
        self._pids: Optional[list[int]] = None

    def _create(self, client_script: Optional[str]) -> None:
        if client_script is not None:
            raise RuntimeError("LocalWorkersJob cannot run batch-mode scripts")
        self._workers = [f"tcp://127.0.0.1:{_free_port()}" for _ in range(self._num_hosts)]
        self._pids = [
            subprocess.Popen(
                [sys.executable, "-c", WORKER, address],
                env={**os.environ, **self._env},
                start_new_session=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            ).pid
            for address in self._workers
        ]

    def can_run(self, spec: JobTrait) -> bool:
        if not isinstance(spec, LocalWorkersJob):
            return False
        return spec._num_hosts == self._num_hosts and spec._env == self._env

    def _state(self) -> JobState:
        return JobState(
            {
                "workers": attach_to_workers(
                    name="workers", ca="trust_all_connections", workers=self._workers
                )
            }
        )

    def _kill(self) -> None:
        for pid in self._pids or []:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
'''

CLIENT = """
    import json, os, sys
    from danaus.actor import Actor, endpoint
    from monarch_style_job import LocalWorkersJob

    class Where(Actor):
        @endpoint
        def worker(self):
            with open(f"/proc/{os.getppid()}/stat") as f:  # proc -> zygote -> worker
                return int(f.read().rpartition(")")[2].split()[1])

    job = LocalWorkersJob(hosts=2, env={"MARK": "x"})
    if sys.argv[1:] == ["batch"]:
        try:
            job.apply("train.py")
        except RuntimeError as e:
            print(json.dumps({"batch": str(e)}), flush=True)
        sys.exit(0)
    state = job.state()  # applies, or reconnects through .danaus/job_state.json
    procs = state.workers.spawn_procs(per_host={"gpus": 1})
    workers = sorted(procs.spawn("where", Where).worker.call().get(timeout=60).values())
    print(json.dumps({"workers": workers, "pids": sorted(job._running._pids)}), flush=True)
    if sys.argv[1:] == ["kill"]:
        job.kill()
"""


def _run(scripts: Scripts, *args: str) -> dict[str, object]:
    p = scripts.start_path(scripts.write(CLIENT), *args)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.fixture
def monarch_scripts(scripts: Scripts) -> Scripts:
    scripts.write(JOB_MODULE, "monarch_style_job.py")
    scripts.env = {"DANAUS_SECRET": secrets.token_hex(32)}
    return scripts


def test_a_monarch_job_class_applies_saves_reconnects_and_kills(monarch_scripts: Scripts) -> None:
    first = _run(monarch_scripts)
    pids = first["pids"]
    assert isinstance(pids, list) and len(pids) == 2
    assert first["workers"] == pids  # the actors ran under the job's own workers
    assert all(pid_alive(p) for p in pids)  # the first client left them running

    saved = json.loads((monarch_scripts.tmp_path / ".danaus" / "job_state.json").read_text())
    assert saved["kind"] == "monarch_style_job.LocalWorkersJob"
    kept = saved["job"]["attributes"]  # the attributes Monarch's class keeps, as JSON data
    assert kept["_num_hosts"] == 2 and kept["_env"] == {"MARK": "x"}
    assert kept["_pids"] == pids

    second = _run(monarch_scripts, "kill")  # reconnects (can_run), then kills
    assert second == first  # the same workers served the second client
    wait_pids_gone(pids)
    assert not (monarch_scripts.tmp_path / ".danaus" / "job_state.json").exists()


def test_a_monarch_job_refusing_a_batch_script_says_so(monarch_scripts: Scripts) -> None:
    out = _run(monarch_scripts, "batch")
    assert out == {"batch": "LocalWorkersJob cannot run batch-mode scripts"}


class _Specless(JobTrait):
    def __init__(self) -> None:
        super().__init__()
        self.ran: list[str | None] = []

    def _create(self, client_script: str | None) -> None:
        self.ran.append(client_script)

    def _state(self) -> JobState:
        return JobState({"trainers": "a mesh"})  # type: ignore[dict-item]


def test_apply_calls_create_with_the_client_script_and_state_calls_state_once() -> None:
    job = _Specless()
    job.apply()
    job.apply()  # already applied: a no-op
    assert job.ran == [None]
    state = job.state(cached_path=None)
    assert state.trainers == "a mesh" and job.state(cached_path=None) is state
    assert state.telemetry_url is None and state.dashboard_url is None
    with pytest.raises(AttributeError, match=r"no mesh named 'dataloaders'.*\['trainers'\]"):
        _ = state.dataloaders
    job.kill()
    other = _Specless()
    other.apply("train.py")
    assert other.ran == ["train.py"]


def test_state_must_return_a_job_state() -> None:
    class Wrong(_Specless):
        def _state(self) -> JobState:
            return {"trainers": 1}  # type: ignore[return-value]

    with pytest.raises(TypeError, match=r"Wrong._state\(\) must return a JobState"):
        Wrong().state(cached_path=None)


def test_a_saved_job_cannot_overwrite_methods_through_its_attributes() -> None:
    job = _Specless()
    job.apply()
    data = json.loads(job.dumps())
    assert data["job"]["attributes"] == {"ran": [None]}
    data["job"]["attributes"]["_state"] = "not a method"
    with pytest.raises(ValueError, match="may not set '_state'"):
        job_loads(json.dumps(data).encode())
