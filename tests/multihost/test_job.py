"""``ProcessJob``: local worker processes on loopback, end to end.

It runs in a client of its own: a ``ProcessJob`` makes a fresh job secret,
and a client holds one secret (this pytest process already has the
session's).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from .conftest import client_env

CLIENT = textwrap.dedent(
    """
    import json, os
    from danaus.actor import Actor, current_rank, endpoint
    from danaus.job import ProcessJob

    def parent(pid):
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rpartition(")")[2].split()[1])

    class Where(Actor):
        @endpoint
        def where(self):
            zygote = os.getppid()
            worker = parent(zygote)
            return {"rank": current_rank().rank, "pid": os.getpid(), "worker": worker,
                    "worker_parent": parent(worker)}

    job = ProcessJob({"trainers": 2})
    job.apply()
    try:
        trainers = job.state().trainers
        procs = trainers.spawn_procs(per_host={"gpus": 2})
        actors = procs.spawn("where", Where)
        answers = list(actors.where.call().get(timeout=30).values())
        print(json.dumps({
            "hosts": trainers.sizes,
            "procs": procs.sizes,
            "answers": answers,
            "workers": [w.pid for w in job.workers["trainers"]],
        }), flush=True)
        procs.stop().get(timeout=30)
    finally:
        job.kill()
    """
)


def test_process_job_runs_actors_on_local_worker_hosts(tmp_path) -> None:
    script = tmp_path / "job_client.py"
    script.write_text(CLIENT)
    out = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=client_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["hosts"] == {"hosts": 2}
    assert result["procs"] == {"hosts": 2, "gpus": 2}
    assert [a["rank"] for a in result["answers"]] == [0, 1, 2, 3]
    assert len({a["pid"] for a in result["answers"]}) == 4
    # proc -> zygote -> worker: two worker processes (the job's), two procs each.
    workers = [a["worker"] for a in result["answers"]]
    assert workers[0] == workers[1] != workers[2] == workers[3]
    assert [workers[0], workers[2]] == result["workers"]


TWO_JOBS = textwrap.dedent(
    """
    import json
    from danaus.actor import Actor, endpoint
    from danaus.job import ProcessJob

    class Echo(Actor):
        @endpoint
        def echo(self, x):
            return x

    first, second = ProcessJob({"a": 1}), ProcessJob({"b": 1})
    try:
        answers = []
        for job, mesh in ((first, "a"), (second, "b")):
            procs = getattr(job.state(), mesh).spawn_procs(per_host={"gpus": 1})
            answers.append(procs.spawn("echo", Echo).echo.call_one(mesh).get(timeout=30))
        print(json.dumps(answers), flush=True)
    finally:
        first.kill()
        second.kill()
    """
)


def test_two_process_jobs_in_one_client_both_work(tmp_path) -> None:
    script = tmp_path / "two_jobs.py"
    script.write_text(TWO_JOBS)
    out = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=client_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == ["a", "b"]
