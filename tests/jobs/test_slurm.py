"""``SlurmJob`` against a real local Slurm cluster the tests start (see ``conftest.slurm``)."""

from __future__ import annotations

import json
import os
import stat
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
                    "netns": os.stat("/proc/self/ns/net").st_ino,
                    "gpus": env.get("SLURM_GPUS_ON_NODE")}

    def procs_with(secret, what):
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/{what}", "rb") as f:
                    if secret.encode() in f.read():
                        found.append(int(pid))
            except OSError:
                pass
        return found

    # Every option of the signature, each with a value Slurm shows back (see the test).
    job = SlurmJob({"trainers": 2}, python_exe=sys.executable, port=int(sys.argv[1]),
                   log_dir=sys.argv[2], job_name="danaus_test", time_limit="00:10:00",
                   slurm_args=["--comment=danaus-options"], ntasks_per_node=2,
                   partition="debug", exclusive=True, gpus_per_node=2, cpus_per_task=1,
                   mem="100M", job_start_timeout=120, account="acme", qos="normal")
    trainers = job.state(cached_path=None).trainers
    procs = trainers.spawn_procs(per_host={"gpus": 2})
    answers = list(procs.spawn("where", Where).where.call().get(timeout=30).values())
    print(json.dumps({
        "job_id": job.job_id, "nodes": job.nodes, "answers": answers,
        "secret": job._secret, "secret_in_cmdlines": procs_with(job._secret, "cmdline"),
        # The nodes share this machine's /proc: sbatch, the batch script, srun, the
        # workers, their zygotes and procs (issue 26, F7).
        "secret_in_environs": procs_with(job._secret, "environ"),
        "secret_file": job._secret_path,
    }), flush=True)
    sys.stdin.readline()  # the test looks at the running job, then lets us kill it
    job.kill()
"""


def _job_fields(slurm: Slurm, job_id: str) -> dict[str, str]:
    out = slurm.run("scontrol", "-o", "show", "job", job_id).stdout
    return dict(w.partition("=")[::2] for w in out.split() if "=" in w)


def test_slurm_job_runs_actors_on_the_allocation_and_kill_cancels_it(
    slurm: Slurm, scripts: Scripts
) -> None:
    path = scripts.write(CLIENT)
    logs = scripts.tmp_path / "logs"
    client = scripts.start_path(path, str(free_port()), str(logs))
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
    # Each option reached Slurm: the controller's own record of the job shows it.
    fields = _job_fields(slurm, job_id)
    assert fields["JobName"] == "danaus_test"
    assert fields["StdOut"] == str(logs / f"slurm-{job_id}-danaus_test.out")
    assert fields["TimeLimit"] == "00:10:00" and fields["Partition"] == "debug"
    assert fields["NumTasks"] == "4"  # ntasks_per_node=2 on 2 nodes
    assert fields["CPUs/Task"] == "1" and fields["MinMemoryNode"] == "100M"
    assert fields["TresPerNode"] == "gres:gpu:2" and fields["OverSubscribe"] == "NO"
    assert fields["Account"] == "acme" and fields["Comment"] == "danaus-options"
    assert fields["Requeue"] == "0"  # a failed node ends the job (see below)
    # The workers' step, and so their procs, hold the node's two (stand-in) GPUs.
    assert [a["gpus"] for a in result["answers"]] == ["2"] * 4
    # The secret is in no command line and not in the script Slurm keeps. (The test
    # cluster has no accounting database, so Slurm drops --qos: the script shows it.)
    assert result["secret_in_cmdlines"] == []
    # Nor in any process's environment: the workers read it from a file only the user
    # can read, removed when the job ends.
    assert result["secret_in_environs"] == []
    assert stat.S_IMODE(os.stat(result["secret_file"]).st_mode) == 0o600
    script = slurm.run("scontrol", "write", "batch_script", job_id, "-")
    assert script.returncode == 0, script.stderr
    assert "danaus worker" in script.stdout and result["secret"] not in script.stdout
    assert "#SBATCH --qos=normal" in script.stdout
    client.stdin.write("\n")
    client.stdin.flush()
    _, err = client.communicate(timeout=30)
    assert client.returncode == 0, err
    wait_until(lambda: slurm.job_state(job_id) == "CANCELLED", "the job being cancelled")
    assert not os.path.exists(result["secret_file"])


@pytest.mark.parametrize(
    ("option", "reason"),
    [
        ({"partition": "nosuchpartition"}, "invalid partition"),
        ({"gpus_per_node": 3}, "Requested node configuration is not available"),
        ({"mem": "100G"}, "Memory specification can not be satisfied"),
        ({"slurm_args": ["--constraint=nosuchfeature"]}, "Invalid feature specification"),
    ],
)
def test_sbatch_refusing_the_request_quotes_its_reason(
    slurm: Slurm, tmp_path, option: dict, reason: str
) -> None:
    job = SlurmJob({"a": 1}, log_dir=str(tmp_path), **option)
    with pytest.raises(SlurmError, match=rf"sbatch refused the job: (.|\n)*{reason}"):
        job.apply()
    assert not job.active and job.job_id is None


def test_a_job_pending_too_long_is_cancelled_quoting_the_pending_reason(
    slurm: Slurm, tmp_path
) -> None:
    # Three nodes from a two-node cluster: Slurm accepts it and leaves it pending.
    job = SlurmJob({"a": 3}, log_dir=str(tmp_path), job_start_timeout=0.5, exclusive=False)
    with pytest.raises(SlurmError, match=r"did not start within 0.5 s \(PENDING, reason \w+"):
        job.apply()
    assert job.job_id is not None
    wait_until(lambda: slurm.job_state(str(job.job_id)) in ("CANCELLED", "gone"), "the cancel")
    assert _job_fields(slurm, str(job.job_id))["OverSubscribe"] == "OK"  # exclusive=False


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


NODE_FAILS = """
    import sys
    from danaus.job import SlurmJob

    job = SlurmJob({"a": 2}, python_exe=sys.argv[1], port=int(sys.argv[2]),
                   log_dir=sys.argv[3], job_name="danaus_nodefail")
    try:
        job.state(cached_path=None)
        print("attached", flush=True)
    except Exception as e:
        print(type(e).__name__, e, flush=True)
"""


@pytest.mark.timeout(120)
def test_a_node_that_fails_ends_the_job_and_the_error_quotes_slurms_reason(
    slurm: Slurm, scripts: Scripts
) -> None:
    # On danaus2 the worker never comes up, so the client is still attaching when
    # the node fails (an administrator, or slurmctld, marks it DOWN).
    python = scripts.tmp_path / "python-or-hang"
    python.write_text(
        "#!/bin/sh\n"
        '[ "$SLURMD_NODENAME" = danaus2 ] && exec sleep 300\n'
        f'exec {sys.executable} "$@"\n'
    )
    python.chmod(0o755)
    path = scripts.write(NODE_FAILS)
    client = scripts.start_path(path, str(python), str(free_port()), str(scripts.tmp_path))
    try:
        wait_until(
            lambda: slurm.run("squeue", "-h", "-n", "danaus_nodefail", "-t", "R").stdout.strip(),
            "the job running",
            timeout=60,
        )
        down = slurm.run(
            "scontrol", "update", "NodeName=danaus2", "State=DOWN", "Reason=danaus test"
        )
        assert down.returncode == 0, down.stderr
        out, err = client.communicate(timeout=60)
    finally:
        # The test cluster returns a DOWN node to service when its slurmd registers again.
        wait_until(
            lambda: slurm.run("sinfo", "-h", "-o", "%T").stdout.strip() == "idle",
            "danaus2 returning to service",
        )
    assert client.returncode == 0, err
    assert out.startswith("SlurmError Slurm job "), out
    # Slurm's reason is quoted; the state is the final NODE_FAIL, or COMPLETING when
    # Slurm is still ending the job step after the client's wait for the final state.
    assert (
        "ended (NODE_FAIL, reason NodeDown)" in out
        or "stopped running (COMPLETING, reason NodeDown" in out
    ), out
