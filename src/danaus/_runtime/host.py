"""This process's runtime and its host agent: started lazily, thread-safely, once.

In the client, the first use starts a runtime on a background thread and,
on the first spawn, a host agent process tied to the client by a lifeline
pipe. In a spawned proc, the runtime already exists and the agent is the one
that spawned it.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import threading
from typing import Any

from .. import _config as config
from .._transport.address import make_job_dir
from .._wire.ids import ProcId
from .._wire.protocol import KillProcs, SpawnProcs
from . import logs as _logs  # noqa: F401  (sets up logs in every proc and the client)
from . import proc as _proc
from .runtime import Runtime

__all__ = [
    "agent",
    "ensure_runtime",
    "kill_procs",
    "new_proc_name",
    "share_secret",
    "shutdown",
    "spawn_procs",
]

_lock = threading.RLock()
_agent_proc: subprocess.Popen[bytes] | None = None
_agent_id: ProcId | None = None
_shut_down = False

# Modules the zygote imports once, so every forked proc starts with them loaded;
# higher layers add themselves (this layer names none of them).
PRELOAD: list[str] = []


def ensure_runtime() -> Runtime:
    """The runtime of this process; in the client, start it on first use."""
    rt = _proc.current()
    if rt is not None:
        return rt
    with _lock:
        rt = _proc.current()
        if rt is not None:
            return rt
        if _shut_down:
            raise RuntimeError(
                "the danaus client was shut down (shutdown_context()); it cannot be restarted "
                "in this process"
            )
        rt = Runtime("c" + secrets.token_hex(3), make_job_dir())
        rt.start(in_thread=True)
        _proc.set_current(rt)
        for hook in _proc.proc_init_hooks:
            hook(rt, {})
        return rt


def check_running() -> None:
    """Raise ``RuntimeError`` if this client was shut down."""
    if _shut_down:
        raise RuntimeError(
            "the danaus client was shut down (shutdown_context()); it cannot spawn anything "
            "in this process any more"
        )


def new_proc_name() -> str:
    return "p" + secrets.token_hex(4)


def agent() -> ProcId:
    """The host agent of this host, starting it if this is the client and it is not running."""
    global _agent_proc, _agent_id
    rt = ensure_runtime()
    if rt.boot:
        agent_id: ProcId = rt.boot["agent"]
        return agent_id
    with _lock:
        if _agent_id is not None:
            return _agent_id
        name = "a" + secrets.token_hex(3)
        agent_id = ProcId(name, f"unix:{os.path.join(rt.job_dir, name + '.sock')}")
        rt.expect(agent_id)
        _agent_proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "danaus._runtime.agent",
                "--dir",
                rt.job_dir,
                "--name",
                name,
                "--owner",
                f"{rt.proc_id.name}={rt.proc_id.addr}",
                "--preload",
                ",".join(PRELOAD),
            ],
            stdin=subprocess.PIPE,
            start_new_session=True,  # Ctrl-C in a terminal reaches the client only
            env={
                **os.environ,
                **config.env_for_children(),  # configure() values reach the procs
                "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
                "DANAUS_HOST_TOKEN": rt.host,
            },
        )
        _agent_id = agent_id
        proc = _agent_proc
        if rt.secret is not None:
            _tell_secret(proc, rt.secret)
        threading.Thread(
            target=_watch_agent, args=(rt, agent_id, proc), name="danaus-agent-watch", daemon=True
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
    with _lock:
        if _agent_proc is not None:
            _tell_secret(_agent_proc, secret)


def _watch_agent(rt: Runtime, agent_id: ProcId, proc: subprocess.Popen[bytes]) -> None:
    """The local agent exited (crashed at start, killed, or shut down): nothing may wait on it."""
    code = proc.wait()
    reason = f"the host agent {agent_id.name} exited with code {code}"
    rt.call_soon(rt.peer_lost, agent_id.name, reason)


# Procs requested from each agent, so that losing the agent fails those not yet up.
_requested: dict[str, list[ProcId]] = {}


def _on_agent_lost(rt: Runtime, name: str, reason: str) -> None:
    for proc in _requested.pop(name, []):
        if rt.is_pending(proc.name):
            rt.peer_lost(proc.name, f"proc {proc.name} was never started: {reason}")


def spawn_procs(procs: list[tuple[ProcId, dict[str, Any]]], on: ProcId | None = None) -> None:
    """Ask host agent ``on`` (default: this host's) to start ``procs``.

    Each proc sends READY to its ``boot['owner']`` once up.
    """
    rt = ensure_runtime()
    target = on or agent()
    for proc, _ in procs:
        rt.expect(proc)
    with _lock:
        if not _requested:
            rt.lost_callbacks.append(lambda name, reason: _on_agent_lost(rt, name, reason))
        _requested.setdefault(target.name, []).extend(p for p, _ in procs)
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
        **extra,
    }


def mark_shut_down() -> None:
    global _shut_down
    _shut_down = True


def shutdown() -> None:
    """Close the lifeline: the agent kills whatever procs remain and exits (client only)."""
    global _shut_down, _agent_proc
    with _lock:
        _shut_down = True
        p, _agent_proc = _agent_proc, None
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
