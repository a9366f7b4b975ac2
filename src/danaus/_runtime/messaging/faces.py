"""What the runtime hands each part it builds: a record of the callables it needs.

The runtime (``runtime.Runtime``) is a composition root: it builds the offload,
the cast tree's router and the relay, and hands each the callables below, never
itself, so no part can reach through the runtime into another part. Each
record names exactly what its part calls; the part imports neither the runtime
nor another part (the graph of imports has no cycle). Fields that change while
the runtime lives (its own address) are functions to call, not values.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..._wire.ids import ProcId

if TYPE_CHECKING:
    import socket

    from ..._transport.conn import Connection
    from ..._transport.inproc import Network
    from ..._wire.frame import Frame
    from ..._wire.ids import ActorId, PortId
    from ..._wire.protocol import Kind, Message
    from .gathers import GatherCalls
    from .peers import _Peer

__all__ = ["OffloadCalls", "RelayCalls", "TreeCalls"]

Handler = Callable[["Connection", "Message"], None]


@dataclass(frozen=True, slots=True)
class OffloadCalls:
    """What ``offload.Offloader`` calls."""

    loop: asyncio.AbstractEventLoop
    me: Callable[[], ProcId]  # this proc (its address changes when it listens on TCP)
    register: Callable[[Kind, Handler], None]  # handle a frame kind
    on_peer_lost: Callable[[Callable[[str, str], None]], None]  # hear of every lost peer
    dispatch: Callable[[Connection, Frame], None]  # a received frame, unwrapped
    send: Callable[..., None]  # the sender's ``send``
    port: Callable[[int], Any]  # the handler of a local port, or None
    bounce: Callable[[ActorId | None, str, str], None]  # return an undeliverable message
    undeliverable: Callable[[PortId | None, int, str], None]  # answer a call that cannot land
    notify_room: Callable[[], None]  # wake senders held back (backpressure)


@dataclass(frozen=True, slots=True)
class TreeCalls:
    """What ``tree.TreeRouter`` calls; ``gather`` is what its gathers call."""

    me: Callable[[], ProcId]
    register: Callable[[Kind, Handler], None]
    handler: Callable[[Kind], Handler | None]  # the handler of a frame kind (STOP_ACTOR)
    send: Callable[..., None]
    reply: Callable[..., int]
    bounce: Callable[[ActorId | None, str, str], None]
    resolve: Callable[[ProcId], ProcId]  # a proc's freshest address
    is_lost: Callable[[str], str | None]
    deliver_call: Callable[[Message, ProcId | None], None]  # to a local mailbox
    port: Callable[[int], Any]
    gather: GatherCalls


@dataclass(frozen=True, slots=True)
class RelayCalls:
    """What ``relay.Relay`` calls: the links' dialling, the listeners' relay ports."""

    loop: asyncio.AbstractEventLoop
    me: Callable[[], ProcId]
    host: str  # this host's token
    inproc: Network  # the in-process listeners of this runtime's transport
    tcp_advertise: Callable[[], str | None]  # where other hosts reach us (None: no TCP)
    call_soon: Callable[..., None]  # run on the I/O thread
    register: Callable[[Kind, Handler], None]
    # These three take a relayed connection too (an in-process one: no Connection).
    dispatch: Callable[[Any, Frame], None]
    dial: Callable[[str, Callable[[Connection, Frame], None]], Connection]
    dialing: Callable[[_Peer, Any, tuple[Any, ...]], None]  # a dial awaits WELCOME
    conn_closed: Callable[[Any, BaseException | None], None]
    accept_relayed: Callable[[Any], None]
    advertise_via: Callable[[str], None]  # be reached through the gateway from now on
    open_relay_port: Callable[[Callable[[Connection, Frame], None]], tuple[socket.socket, str]]
    close_relay_port: Callable[[socket.socket], None]
    peer_lost: Callable[[str, str], None]
    notify_room: Callable[[], None]
