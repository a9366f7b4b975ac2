"""``JobTrait``: the cached job state lets a later client reconnect to the same workers."""

from __future__ import annotations

import json

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
