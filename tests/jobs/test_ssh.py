"""``SSHJob`` against a real sshd the tests start (see ``conftest.sshd``)."""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

import pytest

from danaus.job import SSHJob
from danaus.testing import wait_pids_gone

from .conftest import SSHD, Scripts, free_port

CLIENT = """
    import json, os, sys
    from danaus.actor import Actor, endpoint
    from danaus.job import SSHJob

    class Where(Actor):
        @endpoint
        def where(self):
            with open(f"/proc/{os.getppid()}/stat") as f:  # proc -> zygote -> worker
                worker = int(f.read().rpartition(")")[2].split()[1])
            return worker

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

    ssh_args, port = json.loads(sys.argv[1]), int(sys.argv[2])
    job = SSHJob(["127.0.0.1", "127.0.0.2"], python_exe=sys.executable, ssh_args=ssh_args,
                 port=port)
    hosts = job.state(cached_path=None).hosts
    procs = hosts.spawn_procs(per_host={"gpus": 2})
    workers = list(procs.spawn("where", Where).where.call().get(timeout=30).values())
    started = job.workers["hosts"]
    print(json.dumps({
        "sizes": procs.sizes,
        "workers": workers,
        "started": [[w.host, w.address, w.pid] for w in started],
        "secret_in_cmdlines": cmdlines_with(job._secret),
    }), flush=True)
    job.kill()
"""


def test_ssh_job_starts_workers_over_ssh_and_kill_ends_them(sshd: SSHD, scripts: Scripts) -> None:
    port = free_port()
    path = scripts.write(CLIENT)
    client = scripts.start_path(path, json.dumps(sshd.ssh_args), str(port))
    out, err = client.communicate(timeout=60)
    assert client.returncode == 0, err
    result = json.loads(out.strip().splitlines()[-1])
    assert result["sizes"] == {"hosts": 2, "gpus": 2}
    started = result["started"]
    assert [(h, a) for h, a, _ in started] == [
        ("127.0.0.1", f"tcp://127.0.0.1:{port}"),
        ("127.0.0.2", f"tcp://127.0.0.2:{port}"),
    ]
    pids = [p for _, _, p in started]
    assert result["workers"] == [pids[0], pids[0], pids[1], pids[1]]
    assert result["secret_in_cmdlines"] == []  # the secret went over stdin
    assert wait_pids_gone(pids) == []


def test_a_host_without_danaus_is_named_with_the_commands_stderr(sshd: SSHD) -> None:
    job = SSHJob(["127.0.0.2"], python_exe="/usr/bin/python3", ssh_args=sshd.ssh_args)
    if sys.executable == "/usr/bin/python3":  # pragma: no cover
        pytest.fail("this test needs danaus to be absent from /usr/bin/python3")
    with pytest.raises(RuntimeError) as e:
        job.apply()
    assert "could not start a worker on host '127.0.0.2'" in str(e.value)
    assert "No module named danaus" in str(e.value)
    assert not job.active


def test_a_host_that_refuses_ssh_is_named_with_sshs_error(sshd: SSHD) -> None:
    closed = free_port()  # nothing listens there
    args = [a if a != str(sshd.port) else str(closed) for a in sshd.ssh_args]
    job = SSHJob(["127.0.0.1"], python_exe=sys.executable, ssh_args=args)
    with pytest.raises(RuntimeError) as e:
        job.apply()
    assert "could not start a worker on host '127.0.0.1'" in str(e.value)
    assert "Connection refused" in str(e.value)
    assert f"port {closed}" in str(e.value)


RECONNECT = """
    import json, os, sys
    from danaus.actor import Actor, endpoint
    from danaus.job import SSHJob

    class Worker(Actor):
        @endpoint
        def worker(self):
            with open(f"/proc/{os.getppid()}/stat") as f:  # proc -> zygote -> worker
                return int(f.read().rpartition(")")[2].split()[1])

    ssh_args, port = json.loads(sys.argv[1]), int(sys.argv[2])
    job = SSHJob(["127.0.0.1", "127.0.0.2"], python_exe=sys.executable, ssh_args=ssh_args,
                 port=port)
    hosts = job.state().hosts  # applies, or reconnects through .danaus/job_state.json
    procs = hosts.spawn_procs(per_host={"gpus": 1})
    workers = list(procs.spawn("w", Worker).worker.call().get(timeout=30).values())
    print(json.dumps({"workers": workers, "started": bool(job.workers)}), flush=True)
    if sys.argv[3:] == ["kill"]:
        job.kill()
"""


def _reconnecting_client(scripts: Scripts, path: str, *args: str) -> dict[str, Any]:
    """Run the RECONNECT client to its end; what it printed."""
    client = scripts.start_path(path, *args)
    out, err = client.communicate(timeout=60)
    assert client.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.timeout(90)
def test_a_second_client_reconnects_to_the_workers_ssh_started(
    sshd: SSHD, scripts: Scripts
) -> None:
    path = scripts.write(RECONNECT)
    args = [json.dumps(sshd.ssh_args), str(free_port())]
    one = _reconnecting_client(scripts, path, *args)
    assert one["started"] and len(set(one["workers"])) == 2
    # The first client exited without kill(): the second attaches to the same workers.
    two = _reconnecting_client(scripts, path, *args, "kill")
    assert two == {"workers": one["workers"], "started": False}
    assert wait_pids_gone(one["workers"]) == []  # its kill() ended them over ssh
    assert not (scripts.tmp_path / ".danaus" / "job_state.json").exists()


@pytest.mark.timeout(120)
def test_a_saved_job_whose_workers_died_is_started_afresh(sshd: SSHD, scripts: Scripts) -> None:
    path = scripts.write(RECONNECT)
    args = [json.dumps(sshd.ssh_args), str(free_port())]
    one = _reconnecting_client(scripts, path, *args)
    assert (scripts.tmp_path / ".danaus" / "job_state.json").exists()
    for pid in set(one["workers"]):  # the hosts' workers die; the saved job still names them
        os.killpg(pid, signal.SIGKILL)  # each worker leads its session (--detach)
    assert wait_pids_gone(one["workers"]) == []
    # The second client finds nobody listening there: it starts new workers, as if no
    # job had been saved, instead of attaching to dead addresses.
    two = _reconnecting_client(scripts, path, *args, "kill")
    assert two["started"] and len(set(two["workers"])) == 2
    assert not set(two["workers"]) & set(one["workers"])
    assert wait_pids_gone(two["workers"]) == []
