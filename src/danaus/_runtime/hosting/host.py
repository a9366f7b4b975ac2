"""This process's runtime and its host agent: started lazily and thread-safely.

In the client, the first use starts a node (a runtime on a background thread)
and, on the first spawn, a host agent process tied to the client by a
lifeline pipe. ``shutdown()`` ends both; the next use starts afresh. In a
spawned proc, the node already exists and the agent is the one that spawned it.
"""

from __future__ import annotations

import gc
import os
import secrets
import subprocess
import sys
import threading
from typing import Any

from ... import _config as config
from ..._transport.address import base_env, make_job_dir
from ..._transport.secret_env import environ_without_secret
from ..._wire.ids import ProcId
from ..._wire.protocol import KillProcs, SpawnProcs
from .. import node as _node
from ..messaging.runtime import Runtime
from ..node import Node

__all__ = [
    "agent",
    "current_node",
    "ensure_node",
    "ensure_runtime",
    "freeze_heap",
    "kill_procs",
    "new_proc_name",
    "share_secret",
    "shutdown",
    "spawn_procs",
]


def ensure_runtime() -> Runtime:
    """The runtime of this process; in the client, start it on first use."""
    node = _node._node  # the fast path of every call: one attribute read
    return (node if node is not None else ensure_node()).runtime


def current_node() -> Node | None:
    """This process's node, if one has started (never starts one)."""
    return _node.current()


def ensure_node() -> Node:
    """This process's node; in the client, start one (a runtime thread) on first use."""
    node = _node._node
    if node is not None:
        return node
    with _node.lock():
        node = _node.current()
        if node is not None:
            return node
        rt = Runtime("c" + secrets.token_hex(3), make_job_dir())
        rt.start(in_thread=True)
        node = _node.start(rt, client=True, boot={})
        freeze_heap()
        return node


# Per process, not a node part: gc.freeze() is the interpreter's, done once a process.
_frozen = False


def freeze_heap() -> None:
    """Take what is alive now out of the cyclic garbage collector's traversals (``gc_freeze``).

    CPython runs a full collection whenever the objects that survived its
    young collections reach a quarter of the older heap, and then visits every
    tracked object. A client that imported torch has ~170,000 of them (~25,000
    without): pipelining 10,000 calls promotes enough per-call objects for one
    or two full collections per batch, and visiting torch's objects there cost
    about a quarter of the client's throughput although no tensor is sent. The
    objects alive when the runtime starts are mostly modules, classes and
    functions that live as long as the process; frozen, they are no longer
    visited. Garbage is collected first so that none is frozen. Once per process.
    """
    global _frozen
    if _frozen or not gc.isenabled() or not config.get("gc_freeze"):
        return
    _frozen = True
    gc.collect()
    gc.freeze()


def new_proc_name() -> str:
    return "p" + secrets.token_hex(4)


def agent() -> ProcId:
    """The host agent of this host, starting it if this is the client and it is not running."""
    node = ensure_node()
    rt = node.runtime
    if rt.boot:
        agent_id: ProcId = rt.boot["agent"]
        return agent_id
    with node.lock:
        if node.agent_id is not None:
            return node.agent_id
        name = "a" + secrets.token_hex(3)
        agent_id = ProcId(name, f"unix:{os.path.join(rt.job_dir, name + '.sock')}")
        rt.expect(agent_id)
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


def share_secret(secret: bytes) -> None:
    """The client now has a job secret: its local agent passes it to the procs it forks."""
    node = ensure_node()
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
        node.runtime.call_soon(node.runtime.peer_lost, agent_id.name, reason)


def _on_agent_lost(node: Node, name: str, reason: str) -> None:
    rt = node.runtime
    with node.lock:
        lost = node.requested.pop(name, [])
    for proc in lost:
        if rt.is_pending(proc.name):
            rt.peer_lost(proc.name, f"proc {proc.name} was never started: {reason}")


def spawn_procs(procs: list[tuple[ProcId, dict[str, Any]]], on: ProcId | None = None) -> None:
    """Ask host agent ``on`` (default: this host's) to start ``procs``.

    Each proc sends READY to its ``boot['owner']`` once up.
    """
    node = ensure_node()
    rt = node.runtime
    target = on or agent()
    for proc, _ in procs:
        rt.expect(proc)
    with node.lock:
        if not node.requested:
            rt.lost_callbacks.append(lambda name, reason: _on_agent_lost(node, name, reason))
        node.requested.setdefault(target.name, []).extend(p for p, _ in procs)
    rt.send(target, SpawnProcs(rt.proc_id, procs))


def kill_procs(names: list[str]) -> None:
    """SIGKILL procs of this host by name (fire and forget)."""
    rt = ensure_runtime()
    rt.send(agent(), KillProcs(names), on_fail=lambda reason: None)


def boot_for(owner: ProcId, **extra: Any) -> dict[str, Any]:
    """The boot dictionary of a new proc owned by ``owner``."""
    rt = ensure_runtime()
    return {
        "job_dir": rt.job_dir,
        "owner": owner,
        "agent": agent(),
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
