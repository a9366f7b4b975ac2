"""Turns FAILED reports and lost procs into ``MeshFailure`` events for their owners."""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING, Any

from .. import _config as config
from .._actor.core import owned, undeliverable
from .._actor.core.cell import ActorCell
from .._actor.core.context import display_name
from .._mesh import Extent, Point
from .._runtime.logs.dirs import NOTIFY
from .._runtime.logs.process import LogControl
from .._runtime.messaging.runtime import Runtime
from .._runtime.node import Node
from .._wire.ids import ActorId
from .._wire.protocol import Kind, Message
from . import hook
from .failure import MeshFailure
from .supervised import intercept

if TYPE_CHECKING:
    from .._actor.core.ports import Undeliverable

__all__ = ["deliver", "install"]

log = logging.getLogger("danaus.supervision")
_KILLED = re.compile(r"\(signal (\d+)\)")  # describe_exit's "killed by SIGKILL (signal 9)"


def install(node: Node, boot: dict[str, Any]) -> None:
    rt = node.runtime
    logs = node.part(LogControl)
    rt.register(Kind.FAILED, lambda conn, msg: _on_failed(node, msg))
    rt.peers.lost_callbacks.append(lambda name, reason: _on_lost(node, logs, name, reason))
    undeliverable.set_client_handler(node, lambda env: _client_undeliverable(node, env))
    if node.client:
        hook.arm_wake_signal()  # a client's node is made on its main thread, in most programs


def _display(rt: Runtime, owner: ActorId | None, om: owned.OwnedMesh, rank: int) -> str:
    """Monarch's name of actor ``rank`` of ``om``: ``<root>.<mod.Cls name{'dim': i/n}>``."""
    creator = "<root>"
    if owner is not None and owner.mesh != "root":
        cell = rt.router.mailboxes.get((owner.mesh, owner.rank))
        inst = getattr(cell, "ctx_instance", None)
        creator = str(inst) if inst is not None else f"<{owner.mesh}[{owner.rank}]>"
    cls = om.ref.cls
    extent = om.mesh._shape.extent
    point = Point(rank, extent) if 0 <= rank < len(om.ref.procs) else Point(0, Extent([], []))
    return display_name(creator, cls.__module__, cls.__qualname__, om.ref.name, point)


def _record(
    node: Node, mesh_id: str, rank: int, reason: str, tb: str = ""
) -> tuple[bool, Any, str]:
    """Mark ``rank`` failed; False if it already was. Returns (new, mesh, name)."""
    om = owned.get(node, mesh_id)
    if om is None:
        return True, None, mesh_id.rsplit(".", 1)[0]
    with om.state.lock:
        if rank in om.state.failed:
            return False, om.mesh, om.ref.name
        om.state.failed[rank] = reason
        if tb:
            om.state.tracebacks[rank] = tb  # shown by the dashboard
    return True, om.mesh, om.ref.name


def _on_failed(node: Node, frame: Message) -> None:
    rt = node.runtime
    owner, mesh_id, rank, reason, tb, origin = frame.header
    new, mesh, name = _record(node, mesh_id, rank, reason, tb)
    if new and not intercept(node, mesh_id, rank, reason, tb):  # a supervisor restarts it
        om = owned.get(node, mesh_id)
        # Monarch names the actor the failure started at, however deep it was
        actor = origin or (_display(rt, owner, om, rank) if om is not None else "")
        deliver(node, owner, MeshFailure(name, [rank], reason, tb, mesh, actor=actor))


def _on_lost(node: Node, logs: LogControl, proc_name: str, reason: str) -> None:
    rt = node.runtime
    if rt.peers.is_stopping(proc_name):
        return
    if proc_name not in rt.peers.exited and rt.peers.spawned_here(proc_name):
        # Lost on its connection's EOF before its host agent's report: that report
        # brings the proc's last lines (LOG_TAIL first). Wait for it, briefly.
        grace = config.get("log_tail_grace")
        rt.peers.when_exited(proc_name, lambda how: _report_lost(node, logs, proc_name, how), grace)
        return
    _report_lost(node, logs, proc_name, reason)


def _report_lost(node: Node, logs: LogControl, proc_name: str, reason: str) -> None:
    rt = node.runtime
    tail = logs.tail(proc_name)
    for om in owned.actor_meshes(node):
        if om.state.stopped:
            continue
        for rank, proc in enumerate(om.ref.procs):
            if proc.name != proc_name:
                continue
            # Monarch's words first (programs match on them), then danaus's detail.
            status = _monarch_status(reason)
            detail = f"actor {om.ref.name}[{rank}]" + (f": {reason}" if status != reason else "")
            why = f"the process this actor was running on failed: {status} ({detail})"
            new, mesh, name = _record(node, om.ref.mesh_id, rank, why)
            if (
                new
                and om.owner is not None
                and not intercept(node, om.ref.mesh_id, rank, why, "", tail)
            ):
                actor = _display(rt, om.owner, om, rank)
                failure = MeshFailure(name, [rank], why, "", mesh, tail, actor=actor)
                deliver(node, om.owner, failure)


def _monarch_status(reason: str) -> str:
    """Monarch's ``ProcStatus`` text for how a proc ended: ``Killed(sig=9)`` for a
    signal; else danaus's reason as it is."""
    m = _KILLED.search(reason)
    return f"Killed(sig={m.group(1)})" if m else reason


def deliver(node: Node, owner: ActorId, failure: MeshFailure) -> None:
    """Give ``failure`` to its owner on ``node``: an actor's ``__supervise__`` or the hook."""
    rt = node.runtime
    if owner.proc.name != rt.proc_id.name:
        log.error("a failure for owner %s reached proc %s: %s", owner, rt.proc_id, failure)
        return
    if owner.mesh == "root" and not rt.boot:
        hook.submit(node, failure)
        return
    cell = rt.router.mailboxes.get((owner.mesh, owner.rank))
    if isinstance(cell, ActorCell) and not cell.stopped:
        cell.supervise(failure)
    else:
        log.error(  # in a proc too, this reaches the terminal: a failure nobody will hear of
            "the owner %s of a failed mesh is gone; dropping %s", owner, failure.report(),
            extra={NOTIFY: True},
        )  # fmt: skip


def _client_undeliverable(node: Node, env: Undeliverable) -> None:
    """A message the client itself sent could not be delivered: like a failure, unhandled."""
    hook.submit(
        node,
        MeshFailure(
            env.dest(),
            [],
            f"a message the client sent to {env.dest()} could not be delivered: {env.error_msg()}",
        ),
    )
