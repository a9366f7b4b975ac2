"""This process's runtime and its host agent: started lazily and thread-safely.

In the client, the first use starts a node (a runtime on a background thread)
and, on the first spawn, a host agent process tied to the client by a
lifeline pipe. ``shutdown()`` ends both; the next use starts afresh. In a
spawned proc, the node already exists and the agent is the one that spawned it.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import threading
from typing import Any

from ... import _config as config
from ..._transport.address import base_env
from ..._transport.secret_env import environ_without_secret
from ..._wire.ids import ProcId
from ..._wire.protocol import KillProcs, SpawnProcs
from .. import node as _node
from ..node import Node

__all__ = [
    "agent",
    "kill_procs",
    "new_proc_name",
    "share_secret",
    "shutdown",
    "spawn_procs",
]


def new_proc_name() -> str:
    return "p" + secrets.token_hex(4)


def agent(node: Node) -> ProcId:
    """The host agent of ``node``'s host, starting it if this is the client and it is not
    running."""
    rt = node.runtime
    if rt.boot:
        agent_id: ProcId = rt.boot["agent"]
        return agent_id
    with node.lock:
        if node.agent_id is not None:
            return node.agent_id
        name = "a" + secrets.token_hex(3)
        agent_id = ProcId(name, f"unix:{os.path.join(rt.job_dir, name + '.sock')}")
        rt.peers.expect(agent_id)
        proc = node.agent_proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "danaus._runtime.hosting.agent",
                "--dir",
                rt.job_dir,
                "--name",
                name,
                "--owner",
                f"{rt.proc_id.name}={rt.proc_id.addr}",
                "--preload",
                ",".join(_node.preload_modules()),
            ],
            stdin=subprocess.PIPE,
            start_new_session=True,  # Ctrl-C in a terminal reaches the client only
            env={
                **environ_without_secret(),  # the secret goes on the lifeline, below
                **config.env_for_children(),  # configure() values reach the procs
                **base_env(),  # the private base directory this client chose (issue 40, N8)
                "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
                "DANAUS_HOST_TOKEN": rt.host,
            },
        )
        node.agent_id = agent_id
        if rt.secret is not None:
            _tell_secret(proc, rt.secret)
        threading.Thread(
            target=_watch_agent, args=(node, agent_id, proc), name="danaus-agent-watch", daemon=True
        ).start()
        return agent_id


def _tell_secret(proc: subprocess.Popen[bytes], secret: bytes) -> None:
    """Give the local agent the job secret on its lifeline (a pipe: never in a frame).

    The write completes before any later SPAWN_PROCS frame is sent, and the agent
    reads its lifeline before it forks, so the procs of that spawn get the secret.
    """
    try:
        assert proc.stdin is not None
        proc.stdin.write(b"secret " + secret.hex().encode() + b"\n")
        proc.stdin.flush()
    except (OSError, ValueError):
        pass  # the agent is gone: its watcher reports that


def share_secret(node: Node, secret: bytes) -> None:
    """The client now has a job secret: its local agent passes it to the procs it forks."""
    with node.lock:
        if node.agent_proc is not None:
            _tell_secret(node.agent_proc, secret)


def _watch_agent(node: Node, agent_id: ProcId, proc: subprocess.Popen[bytes]) -> None:
    """The local agent exited (crashed at start, killed, or shut down): nothing may wait on it."""
    code = proc.wait()
    reason = f"the host agent {agent_id.name} exited with code {code}"
    with _node.lock():
        if node.closed:  # shut down on purpose: the runtime is closed, nothing waits
            return
        node.runtime.call_soon(node.runtime.peers.peer_lost, agent_id.name, reason)


def _on_agent_lost(node: Node, name: str, reason: str) -> None:
    rt = node.runtime
    with node.lock:
        lost = node.requested.pop(name, [])
    for proc in lost:
        if rt.peers.is_pending(proc.name):
            rt.peers.peer_lost(proc.name, f"proc {proc.name} was never started: {reason}")


def spawn_procs(
    node: Node, procs: list[tuple[ProcId, dict[str, Any]]], on: ProcId | None = None
) -> None:
    """Ask host agent ``on`` (default: this host's) to start ``procs`` for ``node``.

    Each proc sends READY to its ``boot['owner']`` once up.
    """
    rt = node.runtime
    target = on or agent(node)
    for proc, _ in procs:
        rt.peers.expect(proc)
    with node.lock:
        if not node.requested:
            rt.peers.lost_callbacks.append(lambda name, reason: _on_agent_lost(node, name, reason))
        node.requested.setdefault(target.name, []).extend(p for p, _ in procs)
    rt.send(target, SpawnProcs(rt.proc_id, procs))


def kill_procs(node: Node, names: list[str]) -> None:
    """SIGKILL procs of ``node``'s host by name (fire and forget)."""
    node.runtime.send(agent(node), KillProcs(names), on_fail=lambda reason: None)


def boot_for(node: Node, owner: ProcId, **extra: Any) -> dict[str, Any]:
    """The boot dictionary of a new proc of ``node``'s, owned by ``owner``."""
    rt = node.runtime
    return {
        "job_dir": rt.job_dir,
        "owner": owner,
        "agent": agent(node),
        "sys_path": list(sys.path),
        "client": rt.boot.get("client", rt.proc_id),
        "host": rt.host,
        # No secret: boots travel in frames, and the agent adds its own host's secret.
        "insecure": rt.insecure,
        "tcp_advertise": rt.tcp_advertise,
        "via": rt.relay.via,  # an attached client's procs are reached through its gateway
        **extra,
    }


def shutdown(node: Node) -> None:
    """End a client's node: close the lifeline (the agent kills whatever procs remain,
    removes the job's socket directory and exits), then close the runtime.
    """
    with node.lock:
        p, node.agent_proc = node.agent_proc, None
    if p is not None:
        try:
            assert p.stdin is not None
            p.stdin.close()
        except OSError:
            pass
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    _node.end(node)
