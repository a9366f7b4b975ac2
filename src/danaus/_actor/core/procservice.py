"""The proc side of spawning and stopping: frame handlers installed in every runtime.

::

    spawner --SPAWN(mesh, rank, init_port, ...)--> proc     creates the ActorCell at once,
                                                            so later calls queue behind __init__
    proc    --REPLY(init_port)--> spawner                   after __init__ (or its error)
    caller  --STOP_ACTOR(mesh, rank, port)--> proc          cell drains, runs __cleanup__, replies
    owner   --STOP_PROC(port)--> proc                       stops every cell, replies, exits
"""

from __future__ import annotations

import collections
import functools
import logging
import time
from typing import Any

from ... import _config as config
from ..._runtime.hosting import proc as _proc
from ..._runtime.messaging.runtime import STATUS_OK, Runtime
from ..._runtime.node import Node
from ..._wire.ids import ProcId
from ..._wire.protocol import Kind, Message
from .async_cell import new_cell
from .cell import ActorCell, on_held_back
from .failing import refuse_stopped

__all__ = ["install"]

log = logging.getLogger("danaus.actor")


def install(node: Node, boot: dict[str, Any]) -> None:
    """Register the actor layer's frame handlers and block hook on ``node``'s runtime."""
    rt = node.runtime
    rt.register(Kind.SPAWN, lambda conn, msg: _on_spawn(node, msg))
    rt.register(Kind.STOP_ACTOR, lambda conn, msg: _on_stop_actor(rt, msg))
    rt.register(Kind.STOP_PROC, lambda conn, msg: _on_stop_proc(node, msg))
    rt.set_block_hook(on_held_back)


def _on_spawn(node: Node, frame: Message) -> None:
    rt = node.runtime
    mesh_id, rank = frame.header.mesh, frame.header.rank
    old = rt.router.mailboxes.get((mesh_id, rank))
    if old is not None and not _gone(old):
        rt.undeliverable(frame.header.port, rank, f"actor {mesh_id}[{rank}] already exists")
        return
    if isinstance(old, ActorCell) and not old.stopped:
        # A failed actor being replaced: its thread ends (nothing could reach it once its
        # key names the new actor); what it still holds queued is answered, not dropped.
        old.stop(None, 0, "replaced by a restart")
    on_exit = functools.partial(_on_exit, node)
    rt.router.mailboxes[(mesh_id, rank)] = new_cell(node, mesh_id, rank, frame, on_exit=on_exit)
    rt.router.mailbox_added((mesh_id, rank))


def _gone(mailbox: Any) -> bool:
    """A stopped or failed actor: a supervisor may spawn its replacement under its key
    (its thread, if still running, only refuses what was already queued to it)."""
    if isinstance(mailbox, Stopped):
        return True
    return isinstance(mailbox, ActorCell) and (mailbox.stopped or mailbox.failed is not None)


def _on_exit(node: Node, cell: ActorCell) -> None:
    """The actor's thread ended: free the cell, leaving a tombstone that answers late calls."""
    rt = node.runtime
    recent = rt.observing.recent
    if recent is not None:  # the telemetry query's actors table keeps it for a while
        inst = cell.ctx_instance
        recent.ended.append(
            {
                "mesh_id": cell.mesh_id,
                "name": cell.display_name,
                "rank": cell.rank,
                "class": inst.class_name if inst is not None else None,
                "state": "failed" if cell.failed is not None else "stopped",
                "failure": cell.failed,
                "started": cell.started,
                "stopped": time.time(),
            }
        )
    if not rt.closed:
        rt.call_soon(_bury, node, cell)


class Stopped:
    """The mailbox of a stopped actor: a late call hears "was stopped", the cell is freed."""

    __slots__ = ("label", "rt")

    def __init__(self, rt: Runtime, label: str) -> None:
        self.rt = rt
        self.label = label

    def deliver(self, frame: Message, sender: ProcId | None) -> None:
        refuse_stopped(self.rt, self.label, frame.header)


class _Graves:
    """Keys of this proc's tombstones, oldest first (a part of its node)."""

    def __init__(self) -> None:
        self.keys: collections.deque[tuple[str, int]] = collections.deque()


def _bury(node: Node, cell: ActorCell) -> None:
    rt = node.runtime
    key = (cell.mesh_id, cell.rank)
    if rt.router.mailboxes.get(key) is not cell:
        return
    rt.router.mailboxes[key] = Stopped(rt, cell._label())
    graves = node.part(_Graves)
    graves.keys.append(key)
    while len(graves.keys) > max(0, config.get("stopped_actors_remembered")):
        old = graves.keys.popleft()
        if isinstance(rt.router.mailboxes.get(old), Stopped):
            del rt.router.mailboxes[old]


def _on_stop_actor(rt: Runtime, frame: Message) -> None:
    mesh_id, rank, port, index, reason = frame.header
    cell = rt.router.mailboxes.get((mesh_id, rank))
    if isinstance(cell, ActorCell):
        cell.stop(port, index, reason)
    elif port is not None:
        rt.reply(port, index, STATUS_OK, None)


def _on_stop_proc(node: Node, frame: Message) -> None:
    rt = node.runtime
    port, index, reason = frame.header
    cells = [c for c in rt.router.mailboxes.values() if isinstance(c, ActorCell)]
    for cell in cells:
        cell.stop(None, 0, reason)
    deadline = rt.loop.time() + config.get("stop_proc_timeout")

    def check() -> None:
        if any(c.thread.is_alive() for c in cells) and rt.loop.time() < deadline:
            rt.loop.call_later(0.002, check)
            return
        if port is not None:
            rt.reply(port, index, STATUS_OK, None)
        if rt.boot:  # a spawned proc exits; the client only stops its actors
            _proc.stop_proc(node, 0)

    check()
