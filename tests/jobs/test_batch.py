"""Batch mode: ``apply(client_script=...)`` runs the client with the job, detached from us."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest

from danaus.job import LocalJob, ProcessJob
from danaus.testing import wait_pids_gone

from .conftest import Scripts, Slurm, free_port, wait_until

WHERE = """
    import json, os, sys
    from danaus.actor import Actor, endpoint

    def parent(pid):
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rpartition(")")[2].split()[1])

    class Where(Actor):
        @endpoint
        def where(self):
            return {"node": os.environ.get("SLURMD_NODENAME"),
                    "netns": os.stat("/proc/self/ns/net").st_ino,
                    "worker": parent(os.getppid())}  # proc -> zygote -> worker

    def client_facts():
        return {"job": os.environ.get("SLURM_JOB_ID"), "cwd": os.getcwd(),
                "netns": os.stat("/proc/self/ns/net").st_ino}
"""

SLURM_TRAIN = """
    import json, sys
    from myjob import job
    from where import Where, client_facts

    hosts = job.state().hosts  # finds the saved job: attaches to its own allocation
    procs = hosts.spawn_procs(per_host={"gpus": 1})
    answers = list(procs.spawn("where", Where).where.call().get(timeout=60).values())
    with open("result.json", "w") as f:
        json.dump({"client": client_facts(), "answers": answers, "job_id": job._running._job()}, f)
    job.kill()  # stops the procs; the allocation ends with this client
    sys.exit(int(sys.argv[1]))
"""

SUBMIT = """
    import json
    from myjob import job
    job.apply(client_script="train.py 3")
    print(json.dumps({"job_id": job.job_id, "log": job.log_path, "secret": job._secret}))
"""


@pytest.mark.timeout(120)
def test_slurm_batch_mode_runs_the_client_inside_the_allocation(
    slurm: Slurm, scripts: Scripts
) -> None:
    d = scripts.tmp_path
    (d / "myjob.py").write_text(
        "from danaus.job import SlurmJob\n"
        f"job = SlurmJob({{'hosts': 2}}, python_exe={sys.executable!r}, port={free_port()}, "
        f"log_dir={str(d)!r}, job_name='danaus_batch')\n"
    )
    (d / "where.py").write_text(textwrap.dedent(WHERE))
    (d / "train.py").write_text(textwrap.dedent(SLURM_TRAIN))
    submit = scripts.start_path(scripts.write(SUBMIT, "submit.py"))
    out, err = submit.communicate(timeout=60)
    assert submit.returncode == 0, err
    sub = json.loads(out)
    job_id = sub["job_id"]
    # apply() returned once Slurm took the job; the client runs without us.
    wait_until(
        lambda: slurm.job_state(job_id) not in ("PENDING", "RUNNING", "CONFIGURING"),
        "the batch job ending",
        timeout=90,
    )
    info = slurm.run("scontrol", "-o", "show", "job", job_id).stdout
    log = Path(sub["log"]).read_text() if os.path.exists(sub["log"]) else "(no log)"
    # The client's exit code is the job's.
    assert "JobState=FAILED" in info and "ExitCode=3:0" in info, f"{info}\n{log}"
    result = json.loads((d / "result.json").read_text())
    assert result["job_id"] == job_id
    assert result["client"]["job"] == job_id and result["client"]["cwd"] == str(d)
    # The client ran on the allocation's first node; the procs on both nodes.
    assert result["client"]["netns"] == slurm.nodes["danaus1"].netns_inode
    assert [a["node"] for a in result["answers"]] == ["danaus1", "danaus2"]
    assert [a["netns"] for a in result["answers"]] == [
        slurm.nodes[n].netns_inode for n in ("danaus1", "danaus2")
    ]
    script = slurm.run("scontrol", "write", "batch_script", job_id, "-").stdout
    assert "train.py 3" in script and sub["secret"] not in script


PROCESS_TRAIN = """
    import json
    from danaus.job import ProcessJob
    from where import Where

    job = ProcessJob({"hosts": 2})
    hosts = job.state().hosts
    procs = hosts.spawn_procs(per_host={"gpus": 1})
    answers = list(procs.spawn("where", Where).where.call().get(timeout=60).values())
    with open("result.json.tmp", "w") as f:
        json.dump([a["worker"] for a in answers], f)
    job.kill()
    import os; os.rename("result.json.tmp", "result.json")
"""

PROCESS_SUBMIT = """
    import json
    from danaus.job import ProcessJob
    job = ProcessJob({"hosts": 2})
    job.apply(client_script="train.py")
    print(json.dumps({"client": job.client_pid, "log": job.client_log,
                      "workers": [w.pid for w in job.workers["hosts"]]}))
"""


@pytest.mark.timeout(90)
def test_process_job_batch_mode_runs_the_client_on_the_started_workers(scripts: Scripts) -> None:
    d = scripts.tmp_path
    (d / "where.py").write_text(textwrap.dedent(WHERE))
    (d / "train.py").write_text(textwrap.dedent(PROCESS_TRAIN))
    submit = scripts.start_path(scripts.write(PROCESS_SUBMIT, "submit.py"))
    out, err = submit.communicate(timeout=60)
    assert submit.returncode == 0, err
    sub = json.loads(out)
    assert sub["log"].startswith(str(d / ".danaus" / "batch-client-"))
    # The client outlives apply()'s process and uses the workers it started.
    wait_until(lambda: (d / "result.json").exists(), "the batch client's result", timeout=60)
    assert json.loads((d / "result.json").read_text()) == sub["workers"]
    assert wait_pids_gone([sub["client"], *sub["workers"]]) == [], Path(sub["log"]).read_text()
    assert not (d / ".danaus" / "job_state.json").exists()  # the client's kill() removed it


def test_batch_mode_needs_a_command_and_a_job_that_can_run_one(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="LocalJob cannot run a batch client"):
        LocalJob().apply(client_script="train.py")
    job = ProcessJob({"hosts": 1})
    with pytest.raises(ValueError, match="client_script must be a command line"):
        job.apply(client_script="  ")
    assert not job.active
