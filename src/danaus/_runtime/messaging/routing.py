"""Routing incoming frames to this proc's mailboxes (actors) and ports (replies).

A part of `Runtime` (``rt.router``), handed
the callables it needs (never the runtime): it holds
the mailboxes by ``(mesh, rank)``, the ports by number, and the calls that came
for an actor still spawning. Its methods run on the I/O thread, except
``direct_frame`` (a waiting thread that reads its own connection) and
``open_port``/``close_port`` (any thread: one dict operation each).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from ... import _config as config
from ..._wire.frame import Frame
from ..._wire.ids import PortId, ProcId
from ..._wire.protocol import Kind, Message, Reply, decode

if TYPE_CHECKING:
    import asyncio

    from ..._transport.conn import Connection
    from ..._wire.ids import ActorId
    from .metrics import Tracer

__all__ = ["Mailbox", "PortHandler", "Router"]

log = logging.getLogger("danaus.runtime")


class PortHandler(Protocol):
    """What a port does with the frames sent to it (called on the I/O thread)."""

    def deliver(self, frame: Message) -> None: ...

    def peer_lost(self, proc: str, reason: str) -> None: ...


class Mailbox(Protocol):
    """An actor's inbox (called on the I/O thread). ``via``: the peer whose connection
    brought the CALL frame (None: this proc's copy of a cast)."""

    def deliver(self, frame: Message, via: ProcId | None) -> None: ...


class Router:
    """This proc's mailboxes and ports, and the delivery of frames to them.

    No lock: the dicts are changed by single operations (atomic under the GIL),
    and ``_early`` only on the I/O thread.

    ``me``: this proc's id and ``tracer``: the running trace (the runtime sets
    both when they change); ``bounce(sender, dest, reason)`` returns a message
    to its sender; ``undeliverable(port, slot, reason)`` answers a call that
    cannot be delivered.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        me: ProcId,
        bounce: Callable[[ActorId | None, str, str], None],
        undeliverable: Callable[[PortId | None, int, str], Any],
    ) -> None:
        self.loop = loop
        self.me = me
        self.tracer: Tracer | None = None
        self._bounce = bounce
        self._undeliverable = undeliverable
        self.mailboxes: dict[tuple[str, int], Mailbox] = {}
        self.ports: dict[int, PortHandler] = {}
        self._port_ids = itertools.count(1)
        # calls that came before their actor's mailbox (I/O thread): (mesh, rank) -> calls
        self._early: dict[tuple[str, int], list[tuple[ProcId | None, Message]]] = {}

    def set_bounce(self, bounce: Callable[[ActorId | None, str, str], None]) -> None:
        """Return undeliverable messages with ``bounce(sender, dest, reason)`` from now on."""
        self._bounce = bounce

    def bounce(self, sender: ActorId | None, dest: str, reason: str) -> None:
        """A message from ``sender`` to ``dest`` could not be delivered: return it."""
        self._bounce(sender, dest, reason)

    # -- ports ----------------------------------------------------------------

    def open_port(self, handler: PortHandler) -> PortId:
        no = next(self._port_ids)
        self.ports[no] = handler
        return tuple.__new__(PortId, (self.me, no))  # PortId's __new__ is Python

    def close_port(self, no: int) -> None:
        self.ports.pop(no, None)

    def on_reply(self, conn: Connection, msg: Message) -> None:
        """A REPLY frame: to its port, or back to its sender if the port is closed."""
        reply: Reply = msg.header
        handler = self.ports.get(reply.port)
        me = self.me.name
        if handler is not None:
            tracer = self.tracer
            if tracer is None:
                handler.deliver(msg)
                return
            t0 = tracer.now()
            handler.deliver(msg)
            flow = f"r:{me}:{reply.port}:{reply.slot}"
            tracer.span("reply received", "reply", t0, flow_in=flow)
            return
        if reply.sender is not None:
            reason = f"port {reply.port} on proc {me} is closed"
            self._bounce(reply.sender, f"port {me}:{reply.port}", reason)

    # -- mailboxes ----------------------------------------------------------

    def on_call(self, conn: Connection, msg: Message) -> None:
        self.deliver_call(msg, conn.peer)

    def deliver_call(self, msg: Message, via: ProcId | None) -> None:
        """Give a call to its mailbox (I/O thread). ``via`` is the peer whose connection
        brought it as a CALL frame, None for this proc's copy of a cast, which the cast
        tree hands over: a connection that brings casts is none for an actor to read
        directly (only the I/O thread routes casts)."""
        mesh, rank = msg.header.mesh, msg.header.rank
        mb = self.mailboxes.get((mesh, rank))
        if mb is not None:
            tracer = self.tracer
            if tracer is None:
                mb.deliver(msg, via)
                return
            t0 = tracer.now()
            mb.deliver(msg, via)
            tracer.span(f"deliver {msg.header.method}", "deliver", t0, {"actor": f"{mesh}[{rank}]"})
            return
        # The actor may be spawning right now: the spawner's SPAWN and a third
        # party's call travel on different connections. Hold the call briefly.
        early = self._early.setdefault((mesh, rank), [])
        early.append((via, msg))
        if len(early) == 1:
            hold = config.get("early_call_hold")
            self.loop.call_later(hold, self._early_expired, (mesh, rank))

    def mailbox_added(self, key: tuple[str, int]) -> None:
        """A mailbox was registered (I/O thread): deliver the calls that came first."""
        mb = self.mailboxes[key]
        for via, frame in self._early.pop(key, []):
            mb.deliver(frame, via)

    def _early_expired(self, key: tuple[str, int]) -> None:
        for _via, frame in self._early.pop(key, []):
            self._no_such_actor(frame)

    def _no_such_actor(self, msg: Message) -> None:
        call = msg.header
        reason = f"no actor {call.mesh}[{call.rank}] on proc {self.me.name}"
        if call.port is None and call.sender is not None:
            self._bounce(call.sender, f"{call.mesh}[{call.rank}].{call.method}()", reason)
        else:
            self._undeliverable(call.port, call.slot, reason)

    # -- direct reads (a waiting thread reads its own reply) -------------------

    def direct_frame(self, conn: Connection, frame: Frame) -> bool:
        """Handle a frame on the thread that read it directly (not the I/O thread).

        Only what is safe off the I/O thread: a reply to a port whose handler
        says so (``direct``), a call to a mailbox that takes it (``direct_call``),
        a ping (reading it was all it asked). Anything else returns False and
        goes to the I/O thread, in order.
        """
        if self.tracer is not None or conn.peer is None:
            return False
        try:
            msg = decode(frame)
        except Exception:
            return False  # the I/O thread reports it (and closes the connection)
        kind = msg.kind
        if kind is Kind.PING:
            return True  # handed on, it would keep the next direct reads waiting for the loop
        if kind is Kind.REPLY:
            handler = self.ports.get(msg.header.port)
            if handler is None or not getattr(handler, "direct", False):
                return False
            handler.deliver(msg)
            return True
        if kind is Kind.CALL:
            mb = self.mailboxes.get((msg.header.mesh, msg.header.rank))
            take = getattr(mb, "direct_call", None)
            return take is not None and bool(take(msg, conn.peer))
        return False
