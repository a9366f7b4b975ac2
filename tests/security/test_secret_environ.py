"""The job secret is in no ``/proc/PID/environ`` of a process danaus starts (issue 26, F7).

Removing ``DANAUS_SECRET`` from ``os.environ`` changes what user code sees, not
the block a process was started with: ``/proc/PID/environ`` shows that block
to every process of the user, and a forked child inherits it. These tests read
the real file (bytes, split on NUL) of each process of a running job.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from danaus._transport.secret_env import environ_without_secret
from danaus.testing import ClientScript, client_env

pytestmark = pytest.mark.timeout(90)

SECRET = "f7" + "9c3e5a1b" * 8  # a value no other process on the machine holds

# The pids of the processes that run a proc: itself, its zygote, the agent (a
# worker, or the client's local agent) that forked the zygote.
WHO = """
import os
from danaus.actor import Actor, endpoint

def ppid(pid):
    with open(f"/proc/{pid}/stat", "rb") as f:
        return int(f.read().rpartition(b")")[2].split()[1])

class Who(Actor):
    @endpoint
    def chain(self):
        zygote = ppid(os.getpid())
        return {"proc": os.getpid(), "zygote": zygote, "agent": ppid(zygote),
                "env_var": os.environ.get("DANAUS_SECRET")}
"""


def _environ(pid: int) -> list[bytes]:
    with open(f"/proc/{pid}/environ", "rb") as f:
        return f.read().split(b"\0")


def _holding(pids: dict[str, int], secret: str) -> dict[str, list[bytes]]:
    """The processes among ``pids`` whose environment holds ``secret`` (and where)."""
    needle = secret.encode()
    out = {}
    for what, pid in pids.items():
        hits = [entry for entry in _environ(pid) if needle in entry]
        if hits:
            out[what] = hits
    return out


def test_no_process_a_process_job_starts_holds_the_secret_in_its_environ(tmp_path) -> None:
    # The user set DANAUS_SECRET for the client (their choice): the client's job uses it,
    # and neither the workers, their zygotes and procs, nor the client's own local agent,
    # its zygote and procs may have it in the environment they were started with.
    ClientScript(tmp_path).write(WHO, "who.py")
    script = ClientScript(tmp_path).write(
        """
        import json, sys
        from danaus.actor import this_host
        from danaus.job import ProcessJob
        from who import Who

        job = ProcessJob({"hosts": 1})
        hosts = job.state(cached_path=None).hosts
        remote = hosts.spawn_procs(per_host={"gpus": 1}).spawn("who", Who)
        local = this_host().spawn_procs(per_host={"gpus": 1}).spawn("who", Who)
        print(json.dumps({
            "worker_pid": job.workers["hosts"][0].pid,
            "remote": remote.chain.call_one().get(timeout=60),
            "local": local.chain.call_one().get(timeout=60),
            "secret": job._secret,
        }), flush=True)
        sys.stdin.readline()  # the test reads the processes' environments meanwhile
        job.kill()
        """
    )
    env = client_env()
    env["DANAUS_SECRET"] = SECRET
    client = subprocess.Popen(
        [sys.executable, str(script)], cwd=tmp_path, env=env, text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert client.stdout is not None and client.stdin is not None
        line = client.stdout.readline()
        if not line:
            pytest.fail(f"the client failed: {client.communicate(timeout=60)[1]}")
        got = json.loads(line)
        assert got["secret"] == SECRET  # the job did use the user's secret
        remote, local = got["remote"], got["local"]
        assert remote["agent"] == got["worker_pid"]  # the worker is the remote agent
        assert local["agent"] not in (client.pid, got["worker_pid"])
        pids = {
            "worker": got["worker_pid"],
            "worker's zygote": remote["zygote"],
            "worker's proc": remote["proc"],
            "local agent": local["agent"],
            "local zygote": local["zygote"],
            "local proc": local["proc"],
        }
        assert _holding(pids, SECRET) == {}
        assert _holding({"client": client.pid}, SECRET)  # the user's own environment
        assert remote["env_var"] is None and local["env_var"] is None
        client.stdin.write("\n")
        client.stdin.flush()
        _, err = client.communicate(timeout=60)
        assert client.returncode == 0, err
    finally:
        if client.poll() is None:
            client.kill()
        client.wait()


def test_a_worker_started_with_the_secret_in_its_environment_wipes_it_before_forking(
    tmp_path,
) -> None:
    # `DANAUS_SECRET=... danaus worker` (docs/concepts/hosts.md, a Slurm batch script):
    # the worker keeps the secret in memory and overwrites it in the environment block
    # it was started with, so neither it nor the zygote and procs it forks show it.
    env = client_env()
    env["DANAUS_SECRET"] = SECRET
    worker = subprocess.Popen(
        [sys.executable, "-m", "danaus", "worker", "--listen", "tcp://127.0.0.1:0"],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        assert worker.stdout is not None
        address = worker.stdout.readline().split()[-1]
        ClientScript(tmp_path).write(WHO, "who.py")
        script = ClientScript(tmp_path).write(
            f"""
            import json, sys
            from danaus.actor import attach_to_workers
            from who import Who

            hosts = attach_to_workers(workers=[{address!r}], secret={SECRET!r})
            who = hosts.spawn_procs(per_host={{"gpus": 1}}).spawn("who", Who)
            print(json.dumps(who.chain.call_one().get(timeout=60)), flush=True)
            sys.stdin.readline()
            hosts.shutdown().get(timeout=30)
            """
        )
        client = subprocess.Popen(
            [sys.executable, str(script)], cwd=tmp_path, env=environ_without_secret(client_env()),
            text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        try:
            assert client.stdout is not None and client.stdin is not None
            line = client.stdout.readline()
            if not line:
                pytest.fail(f"the client failed: {client.communicate(timeout=60)[1]}")
            chain = json.loads(line)
            assert chain["agent"] == worker.pid
            pids = {"worker": worker.pid, "zygote": chain["zygote"], "proc": chain["proc"]}
            assert _holding(pids, SECRET) == {}
            assert chain["env_var"] is None
            client.stdin.write("\n")
            client.stdin.flush()
            _, err = client.communicate(timeout=60)
            assert client.returncode == 0, err
        finally:
            if client.poll() is None:
                client.kill()
            client.wait()
    finally:
        os.killpg(worker.pid, 9)
        worker.wait()
        if worker.stdout is not None:
            worker.stdout.close()


def test_forgetting_the_secret_overwrites_only_its_value_in_the_initial_environment() -> None:
    # In a child started with the secret between two other variables: after the call,
    # /proc/self/environ still has the others, byte for byte, and none of the secret;
    # a process it forks (as a zygote forks procs) does not have it either.
    code = (
        "import os\n"
        "from danaus._transport.secret_env import forget_environ_secret\n"
        "forget_environ_secret()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os.write(1, open('/proc/self/environ', 'rb').read()); os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
        "print(repr(os.environ.get('DANAUS_SECRET')), flush=True)\n"
    )
    env = {
        **client_env(),
        "BEFORE": "DANAUS_SECRET=" + SECRET,  # a value that merely contains the name
        "DANAUS_SECRET": SECRET,
        "AFTER": "kept",
    }
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, timeout=60, check=True
    )
    entries = out.stdout.split(b"\0")
    assert entries[-1] == b"None\n"  # os.environ no longer has it
    assert not any(e.startswith(b"DANAUS_SECRET=") and len(e) > 14 for e in entries)
    assert b"AFTER=kept" in entries
    assert ("BEFORE=DANAUS_SECRET=" + SECRET).encode() in entries  # another variable's value
