"""``hosts_from_config``: the allocation's workers from Slurm's environment, else local ones
(Slurm's host lists are expanded in tests/unit/job/test_config.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from danaus.testing import client_env, wait_pids_gone

from .conftest import LocalWorker, Scripts, Slurm, free_port, wait_until

IN_ALLOCATION = """
    import json, os
    from danaus.actor import Actor, endpoint, hosts_from_config

    class Where(Actor):
        @endpoint
        def where(self):
            return os.getppid()

    hosts = hosts_from_config("MONARCH_HOSTS")
    procs = hosts.spawn_procs(per_host={"gpus": 1})
    zygotes = list(procs.spawn("where", Where).where.call().get(timeout=30).values())
    print(json.dumps({"sizes": hosts.sizes, "zygotes": zygotes}), flush=True)
    procs.stop().get(timeout=30)
"""


def test_in_a_slurm_allocation_it_attaches_to_the_nodes_workers(
    scripts: Scripts, local_workers: list[LocalWorker], job_secret: str
) -> None:
    port = free_port()
    for ip in ("127.0.0.1", "127.0.0.2"):  # two "nodes" as Slurm would name them
        local_workers.append(LocalWorker(port, job_secret, ip))
        assert local_workers[-1].line.startswith("danaus worker listening on"), local_workers[
            -1
        ].line
    path = scripts.write(IN_ALLOCATION)
    scripts.env = {
        "SLURM_JOB_NODELIST": "127.0.0.[1-2]",
        "DANAUS_WORKER_PORT": str(port),
        "DANAUS_SECRET": job_secret,
    }
    client = scripts.start_path(path)
    out, err = client.communicate(timeout=60)
    assert client.returncode == 0, err
    result = json.loads(out.strip().splitlines()[-1])
    assert result["sizes"] == {"hosts": 2}
    assert len(set(result["zygotes"])) == 2  # one proc on each worker


def test_elsewhere_it_starts_two_local_hosts_ended_at_exit(scripts: Scripts) -> None:
    scripts.env = {"SLURM_JOB_NODELIST": "", "SLURM_NODELIST": ""}
    client = scripts.start_path(scripts.write(IN_ALLOCATION))
    out, err = client.communicate(timeout=60)
    assert client.returncode == 0, err
    result = json.loads(out.strip().splitlines()[-1])
    assert result["sizes"] == {"hosts": 2}
    # Ended at exit: the atexit hook once raised ("cannot schedule new futures after
    # interpreter shutdown") and left both workers (and their zygotes) running.
    assert "Exception ignored" not in err, err
    assert wait_pids_gone(result["zygotes"]) == []


IN_SRUN_ALLOCATION = """\
#!/bin/bash
#SBATCH --nodes=2
#SBATCH --job-name=danaus_fromconfig
#SBATCH --output={out}
# docs/jobs.md's batch script: the workers by srun, then the client beside them.
srun --ntasks-per-node=1 {python} -m danaus worker --listen tcp://0.0.0.0:$DANAUS_WORKER_PORT &
{python} {client}
"""

SRUN_CLIENT = """
    import json, os
    from danaus.actor import Actor, endpoint, hosts_from_config

    class Where(Actor):
        @endpoint
        def where(self):
            return {"node": os.environ.get("SLURMD_NODENAME"),
                    "netns": os.stat("/proc/self/ns/net").st_ino}

    hosts = hosts_from_config("trainers")
    procs = hosts.spawn_procs(per_host={"gpus": 2})
    answers = list(procs.spawn("where", Where).where.call().get(timeout=60).values())
    with open("result.json", "w") as f:
        json.dump({"sizes": procs.sizes, "answers": answers,
                   "client_netns": os.stat("/proc/self/ns/net").st_ino}, f)
    procs.stop().get(timeout=30)
"""


@pytest.mark.timeout(120)
def test_in_a_real_allocation_it_attaches_to_the_workers_srun_started(
    slurm: Slurm, scripts: Scripts, job_secret: str
) -> None:
    d = scripts.tmp_path
    client = scripts.write(SRUN_CLIENT, "client.py")
    batch = IN_SRUN_ALLOCATION.format(out=d / "job.out", python=sys.executable, client=client)
    env = {
        **slurm.env,
        **client_env(),
        "DANAUS_SECRET": job_secret,  # the job's environment, as in the docs
        "DANAUS_WORKER_PORT": str(free_port()),
    }
    sub = subprocess.run(
        ["sbatch", "--parsable", f"--chdir={d}"],
        input=batch,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert sub.returncode == 0, sub.stderr
    job_id = sub.stdout.strip()
    wait_until(
        lambda: slurm.job_state(job_id) not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"),
        "the batch job ending",
        timeout=100,
    )
    log = (d / "job.out").read_text() if (d / "job.out").exists() else "(no log)"
    assert slurm.job_state(job_id) == "COMPLETED", log
    result = json.loads((d / "result.json").read_text())
    assert result["sizes"] == {"hosts": 2, "gpus": 2}
    nodes = ["danaus1", "danaus1", "danaus2", "danaus2"]
    assert [a["node"] for a in result["answers"]] == nodes  # $SLURM_JOB_NODELIST's order
    assert [a["netns"] for a in result["answers"]] == [slurm.nodes[n].netns_inode for n in nodes]
    assert result["client_netns"] == slurm.nodes["danaus1"].netns_inode
