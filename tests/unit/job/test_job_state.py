"""A job's specification and its saved state, without starting it (moved from
tests/jobs/test_job_state.py, which keeps the clients that apply and reconnect)."""

from __future__ import annotations

import pytest

from danaus.job import JobTrait, LocalJob, ProcessJob, SSHJob, job_load, job_loads


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
