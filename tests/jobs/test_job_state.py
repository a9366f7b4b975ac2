"""``JobTrait``: the cached job state lets a later client reconnect to the same workers."""

from __future__ import annotations

import json

import pytest

from danaus.job import JobTrait, LocalJob, ProcessJob, SSHJob, job_load, job_loads
from danaus.testing import pid_alive, wait_pids_gone

from .conftest import Scripts

WHERE = """
    import json, os, sys
    from danaus.actor import Actor, endpoint
    from danaus.job import ProcessJob

    def parent(pid):
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rpartition(")")[2].split()[1])

    class Where(Actor):
        @endpoint
        def worker(self):
            return parent(os.getppid())  # proc -> zygote -> worker

    job = ProcessJob({"trainers": 2})
    state = job.state()  # applies, or reconnects through .danaus/job_state.json
    procs = state.trainers.spawn_procs(per_host={"gpus": 1})
    workers = list(procs.spawn("where", Where).worker.call().get(timeout=30).values())
    print(json.dumps({"workers": workers, "started": [w.pid for w in job.workers["trainers"]]
                      if job.workers else None}), flush=True)
    if sys.argv[1:] == ["kill"]:
        job.kill()
"""


def test_a_second_client_reconnects_to_the_workers_the_first_applied(scripts: Scripts) -> None:
    path = scripts.write(WHERE)
    first = scripts.start_path(path)
    out, err = first.communicate(timeout=60)
    assert first.returncode == 0, err
    one = json.loads(out.strip().splitlines()[-1])
    assert len(set(one["workers"])) == 2 and one["workers"] == one["started"]
    # The first client exited without kill(): its workers still run, and the cache names them.
    assert all(pid_alive(p) for p in one["workers"])
    assert (scripts.tmp_path / ".danaus" / "job_state.json").exists()

    second = scripts.start_path(path, "kill")
    out, err = second.communicate(timeout=60)
    assert second.returncode == 0, err
    two = json.loads(out.strip().splitlines()[-1])
    assert two["workers"] == one["workers"]  # the same worker processes, not new ones
    assert two["started"] is None  # the second client's job started nothing itself
    assert wait_pids_gone(one["workers"]) == []  # its kill() ended the first client's workers
    assert not (scripts.tmp_path / ".danaus" / "job_state.json").exists()


def test_dumps_and_loads_round_trip_the_specification() -> None:
    job = SSHJob({"trainers": ["a", "b"]}, python_exe="/opt/py", ssh_args=["-p", "2222"], port=9)
    again = job_loads(job.dumps())
    assert isinstance(again, SSHJob) and not again.active
    assert again.can_run(job) and job.can_run(again)
    assert not job.can_run(SSHJob({"trainers": ["a", "b"]}, python_exe="/opt/py", port=9))
    assert not job.can_run(LocalJob())


def test_dump_writes_a_file_only_its_owner_can_read(tmp_path) -> None:
    path = tmp_path / "sub" / "job.pkl"
    LocalJob(["a", "b"]).dump(str(path))
    assert path.stat().st_mode & 0o077 == 0  # it holds the job secret
    job = job_load(str(path))
    assert isinstance(job, LocalJob) and job.can_run(LocalJob(["a", "b"]))


def test_job_loads_refuses_what_is_not_a_job() -> None:
    with pytest.raises(ValueError, match="not a danaus job state"):
        job_loads(b"{}")
    with pytest.raises(ValueError, match="not a danaus job state"):
        job_loads(b"\x00garbage")


def test_bad_specifications_are_refused_precisely() -> None:
    with pytest.raises(ValueError, match="mesh names must be identifiers"):
        ProcessJob({"a-b": 1})
    with pytest.raises(ValueError, match="host count >= 1"):
        ProcessJob({"a": 0})
    with pytest.raises(TypeError, match="list of host names"):
        SSHJob("node1")
    with pytest.raises(ValueError, match="non-empty list of host names"):
        SSHJob({"a": []})
    with pytest.raises(ValueError, match="names one host twice"):
        SSHJob(["root@n1", "n1"])
    with pytest.raises(ValueError, match="TCP port number"):
        SSHJob(["n1"], port=0)
    with pytest.raises(TypeError, match="ssh_args must be a list"):
        SSHJob(["n1"], ssh_args="-p 22")
    assert isinstance(SSHJob(["n1"]), JobTrait)


def test_a_job_that_cannot_be_saved_says_so_before_it_starts_anything(tmp_path) -> None:
    created: list[str] = []

    class Unsaved(LocalJob):
        def __init__(self) -> None:
            super().__init__()
            self.extra = object()  # not JSON data, not in _to_doc: dumps() refuses it

        def _create(self, *args: object) -> None:
            created.append("created")
            super()._create(*args)

    job = Unsaved()
    with pytest.raises(TypeError, match="cannot be saved"):
        job.state(cached_path=str(tmp_path / ".danaus" / "job_state.json"))
    assert created == []  # nothing was started that no saved job could end
