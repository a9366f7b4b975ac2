"""The node object: a client session that ends and starts again, registries that
forget what stopped, and socket directories that outlive no one. The client's one node
and its parts: ``tests/unit/actor/test_node.py``."""

from __future__ import annotations

import json
import os
import signal

import pytest

from danaus.testing import wait_until

from .conftest import wait_pids_gone


def _left_in(path: str) -> list[str] | None:
    """What directory ``path`` holds; ``None`` once it is gone."""
    try:
        return os.listdir(path)
    except FileNotFoundError:
        return None


@pytest.mark.timeout(90)
def test_shutdown_then_spawn_again_in_the_same_process(client_script) -> None:
    result = client_script.run(
        """
        import json, os
        from danaus.actor import Actor, endpoint, shutdown_context, this_host
        from danaus._runtime import node

        class A(Actor):
            @endpoint
            def pid(self):
                return os.getpid()

        sessions = []
        for i in range(3):
            procs = this_host().spawn_procs(per_host={"gpus": 2})
            a = procs.spawn("a", A)
            pids = list(a.pid.call().get(timeout=30).values())
            n = node.this_node(start=False)
            rt = n.runtime
            sessions.append({"pids": pids, "dir": rt.job_dir, "proc": rt.proc_id.name})
            shutdown_context().get(timeout=30)
            sessions[-1]["dir_left"] = os.path.exists(sessions[-1]["dir"])
        print(json.dumps(sessions))
        """
    )
    assert result.returncode == 0, result.stderr
    sessions = json.loads(result.stdout.strip().splitlines()[-1])
    assert len(sessions) == 3
    # Each session is a new node: a new runtime, a new job directory, new procs.
    assert len({s["proc"] for s in sessions}) == 3
    assert len({s["dir"] for s in sessions}) == 3
    assert len({p for s in sessions for p in s["pids"]}) == 6
    for s in sessions:
        assert s["dir_left"] is False, s
        assert wait_pids_gone(s["pids"], timeout=10) == []


@pytest.mark.timeout(90)
def test_socket_directory_removed_after_sigkill_of_the_client(client_script) -> None:
    p = client_script.start(
        """
        import json, os, sys
        from danaus.actor import Actor, endpoint, this_host
        from danaus._runtime import node

        class A(Actor):
            @endpoint
            def pid(self):
                return os.getpid()

        procs = this_host().spawn_procs(per_host={"gpus": 2})
        pids = list(procs.spawn("a", A).pid.call().get(timeout=30).values())
        job_dir = node.this_node(start=False).runtime.job_dir
        print(json.dumps({"dir": job_dir, "pids": pids}), flush=True)
        sys.stdin.readline()  # until killed
        """
    )
    assert p.stdout is not None
    line = p.stdout.readline()
    assert line, p.stderr.read() if p.stderr else ""
    info = json.loads(line)
    assert os.path.isdir(info["dir"])
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=10)
    # The host agent notices its lifeline closed, kills the procs, removes the directory.
    assert wait_pids_gone(info["pids"], timeout=20) == []
    wait_until(
        lambda: _left_in(info["dir"]),
        20,
        f"{info['dir']} is removed",
        until=lambda left: left is None,
        interval=0.02,
    )


@pytest.mark.timeout(120)
def test_a_thousand_meshes_leave_memory_and_descriptors_flat(client_script) -> None:
    """Create and stop 1,000 actor meshes: registries forget them, memory and fds stay flat.

    Bounds are relative to the state after the first 100 meshes (warm-up), never times.
    """
    result = client_script.run(
        """
        import json, os
        import danaus.config
        danaus.config.configure(stopped_actors_remembered=50)
        from danaus.actor import Actor, endpoint, this_host
        from danaus._actor.core import owned
        from danaus._runtime.node import this_node

        def usage():
            pid = os.getpid()
            rss = int(open(f"/proc/{pid}/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            return {"fds": len(os.listdir(f"/proc/{pid}/fd")), "rss": rss}

        class A(Actor):
            @endpoint
            def usage(self):
                from danaus._runtime.node import this_node
                u = usage()
                u["mailboxes"] = len(this_node().runtime.router.mailboxes)
                return u

        procs = this_host().spawn_procs(per_host={"gpus": 2})
        probe = procs.spawn("probe", A)
        rt = this_node().runtime
        marks = {}
        for i in range(1000):
            m = procs.spawn(f"m{i}", A)
            m.usage.call().get(timeout=30)
            m.stop().get(timeout=30)
            if i in (99, 999):
                marks[i] = {
                    "client": usage(),
                    "procs": list(probe.usage.call().get(timeout=30).values()),
                    "owned": len(owned.actor_meshes(this_node())),
                    "mailboxes": len(rt.router.mailboxes),
                    "peers": len(rt.peers.table),
                    "ports": len(rt.router.ports),
                }
        print(json.dumps(marks))
        """,
        timeout=110,
    )
    assert result.returncode == 0, result.stderr
    marks = json.loads(result.stdout.strip().splitlines()[-1])
    early, late = marks["99"], marks["999"]
    # Registries hold only what lives: the probe and the registry actor, no stopped mesh.
    assert late["owned"] == early["owned"] <= 3
    assert late["mailboxes"] == early["mailboxes"]
    assert late["peers"] == early["peers"] and late["ports"] == early["ports"]
    # Descriptors exactly flat; memory within 10% of what the first 100 meshes left.
    assert late["client"]["fds"] == early["client"]["fds"]
    assert late["client"]["rss"] <= early["client"]["rss"] * 1.10, (early, late)
    for e, lt in zip(early["procs"], late["procs"], strict=True):
        assert lt["fds"] == e["fds"]
        assert lt["mailboxes"] <= 50 + 2  # tombstones bounded by the setting, plus the probe
        assert lt["rss"] <= e["rss"] * 1.10, (e, lt)
