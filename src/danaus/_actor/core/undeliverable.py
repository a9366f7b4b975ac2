"""Undeliverable messages come back to their sender, never silently dropped.

::

    receiver proc --BOUNCE(sender, dest, reason)--> sender's proc   (no such actor, no port)
    sender's runtime (peer lost) ------------------> return_to_sender(...) locally

An actor sender gets ``_handle_undeliverable_message(envelope)`` on its own
thread; returning True survives it, anything else fails the actor. For the
client (no actor), the node's ``ClientHandler`` decides (the supervision layer
sets it with `set_client_handler()`).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from ..._runtime.messaging.runtime import Runtime
from ..._runtime.node import Node
from ..._wire.ids import ActorId
from ..._wire.protocol import Bounce, Kind, Message
from .cell import ActorCell
from .ports import Undeliverable

__all__ = ["ClientHandler", "install", "return_to_sender", "set_client_handler"]

log = logging.getLogger("danaus.actor")


class ClientHandler:
    """What is called with the envelope when a message the client itself sent comes
    back (a node part; the supervision layer sets it)."""

    def __init__(self) -> None:
        self.handler: Callable[[Undeliverable], None] | None = None


def set_client_handler(node: Node, handler: Callable[[Undeliverable], None]) -> None:
    """Call ``handler(envelope)`` when a message the client sent on ``node`` comes back."""
    node.part(ClientHandler).handler = handler


def return_to_sender(node: Node, sender: ActorId | None, dest: str, reason: str) -> None:
    """Give an undeliverable message, sent on ``node``, back to ``sender`` (any thread)."""
    env = Undeliverable(sender, dest, reason)
    rt = node.runtime
    if sender is None or (sender.mesh == "root" and not rt.boot):
        handler = node.part(ClientHandler).handler
        if handler is not None:
            handler(env)
        else:
            log.error("a message from the client could not be delivered: %s", env)
        return
    if sender.proc.name != rt.proc_id.name:
        rt.send(sender.proc, Bounce(sender, dest, reason), on_fail=_log_lost)
        return
    _to_local_actor(rt, env)


def _to_local_actor(rt: Runtime, env: Undeliverable) -> None:
    sender = env.sender()
    assert sender is not None
    cell = rt.router.mailboxes.get((sender.mesh, sender.rank))
    if isinstance(cell, ActorCell):
        cell.undeliverable(env)
    else:
        log.error("undeliverable message for actor %s, which is gone: %s", sender, env)


def _log_lost(reason: str) -> None:
    log.error("an undeliverable message could not be returned to its sender: %s", reason)


def _on_bounce(rt: Runtime, frame: Message) -> None:
    sender, dest, reason = frame.header
    _to_local_actor(rt, Undeliverable(sender, dest, reason))


def install(node: Node, boot: dict[str, Any]) -> None:
    rt = node.runtime
    rt.register(Kind.BOUNCE, lambda conn, msg: _on_bounce(rt, msg))
    rt.set_bounce_handler(functools.partial(return_to_sender, node))
