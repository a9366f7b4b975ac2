"""``SlurmJob`` against a real local Slurm cluster the tests start (see ``conftest.slurm``)."""

from __future__ import annotations

import json
import sys

import pytest

from danaus.job import SlurmError, SlurmJob

from .conftest import Scripts, Slurm, free_port, wait_until

CLIENT = """
    import json, os, sys
    from danaus.actor import Actor, endpoint
    from danaus.job import SlurmJob

    class Where(Actor):
        @endpoint
        def where(self):
            env = os.environ
            return {"job": env.get("SLURM_JOB_ID"), "node": env.get("SLURMD_NODENAME"),
                    "netns": os.stat("/proc/self/ns/net").st_ino}

    def cmdlines_with(secret):
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if secret.encode() in f.read():
                        found.append(int(pid))
            except OSError:
                pass
        return found

    job = SlurmJob({"trainers": 2}, python_exe=sys.executable, port=int(sys.argv[1]),
                   log_dir=sys.argv[2], job_name="danaus_test", time_limit="00:10:00")
    trainers = job.state(cached_path=None).trainers
    procs = trainers.spawn_procs(per_host={"gpus": 2})
    answers = list(procs.spawn("where", Where).where.call().get(timeout=30).values())
    print(json.dumps({
        "job_id": job.job_id, "nodes": job.nodes, "answers": answers,
        "secret": job._secret, "secret_in_cmdlines": cmdlines_with(job._secret),
    }), flush=True)
    sys.stdin.readline()  # the test looks at the running job, then lets us kill it
    job.kill()
"""


def test_slurm_job_runs_actors_on_the_allocation_and_kill_cancels_it(
    slurm: Slurm, scripts: Scripts
) -> None:
    path = scripts.write(CLIENT)
    client = scripts.start_path(path, str(free_port()), str(scripts.tmp_path / "logs"))
    assert client.stdout is not None and client.stdin is not None
    line = client.stdout.readline()
    if not line:
        pytest.fail(f"the client failed: {client.communicate(timeout=30)[1]}")
    result = json.loads(line)
    job_id = result["job_id"]
    assert result["nodes"] == ["danaus1", "danaus2"]
    nodes = ["danaus1", "danaus1", "danaus2", "danaus2"]  # hosts x gpus, row major
    assert [(a["job"], a["node"]) for a in result["answers"]] == [(job_id, n) for n in nodes]
    # Each node's procs run in that node's network namespace, as on separate machines.
    assert [a["netns"] for a in result["answers"]] == [slurm.nodes[n].netns_inode for n in nodes]
    assert slurm.job_state(job_id) == "RUNNING"
    # The secret is in no command line and not in the script Slurm keeps.
    assert result["secret_in_cmdlines"] == []
    script = slurm.run("scontrol", "write", "batch_script", job_id, "-")
    assert script.returncode == 0, script.stderr
    assert "danaus worker" in script.stdout and result["secret"] not in script.stdout
    client.stdin.write("\n")
    client.stdin.flush()
    _, err = client.communicate(timeout=30)
    assert client.returncode == 0, err
    wait_until(lambda: slurm.job_state(job_id) == "CANCELLED", "the job being cancelled")


def test_sbatch_refusing_the_request_quotes_its_reason(slurm: Slurm, tmp_path) -> None:
    job = SlurmJob({"a": 1}, partition="nosuchpartition", log_dir=str(tmp_path))
    with pytest.raises(SlurmError, match=r"sbatch refused the job: .*invalid partition"):
        job.apply()
    assert not job.active


def test_a_job_pending_too_long_is_cancelled_quoting_the_pending_reason(
    slurm: Slurm, tmp_path
) -> None:
    # Three nodes from a two-node cluster: Slurm accepts it and leaves it pending.
    job = SlurmJob({"a": 3}, log_dir=str(tmp_path), job_start_timeout=0.5, exclusive=False)
    with pytest.raises(SlurmError, match=r"did not start within 0.5 s \(PENDING, reason \w+"):
        job.apply()
    assert job.job_id is not None
    wait_until(lambda: slurm.job_state(str(job.job_id)) in ("CANCELLED", "gone"), "the cancel")


FAILING = """
    import sys
    from danaus.job import SlurmJob

    job = SlurmJob({"a": 1}, python_exe="/usr/bin/python3", port=int(sys.argv[1]),
                   log_dir=sys.argv[2])
    try:
        job.state(cached_path=None)
    except Exception as e:
        print(type(e).__name__, e, flush=True)
"""


def test_workers_that_cannot_start_end_the_job_and_the_error_quotes_its_log(
    slurm: Slurm, scripts: Scripts
) -> None:
    if sys.executable == "/usr/bin/python3":  # pragma: no cover
        pytest.fail("this test needs danaus to be absent from /usr/bin/python3")
    path = scripts.write(FAILING)
    client = scripts.start_path(path, str(free_port()), str(scripts.tmp_path))
    out, err = client.communicate(timeout=60)
    assert client.returncode == 0, err
    assert out.startswith("SlurmError Slurm job "), out
    assert "ended (FAILED" in out
    assert "No module named" in out  # the quoted log says why the worker died
