"""The links of a runtime: one connection per peer, dialled or accepted, both ways.

A part of `Runtime` (``rt.links``),
handed the callables it needs. It dials peers (``HELLO``, then nothing but
``PING`` until the peer's ``WELCOME``), answers the ``HELLO`` of procs that
dial us (``WELCOME``, or ``REFUSED`` across protocol versions), settles the
race of two procs that dial each other at once (the smaller name's dial
wins, so only a ``HELLO`` is ever on a connection that is dropped), publishes
an established connection to senders after the frames queued for the peer,
and turns a connection's close into the loss of its peer (after a short
grace for the host agent's exit report of a proc we spawned). See "One
connection per pair" in ``docs/design.md``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ... import _config as config
from ..._transport import tls
from ..._transport.address import choose, connect_socket
from ..._transport.auth import Handshake
from ..._transport.conn import Connection
from ..._wire.frame import Frame, encode_frame
from ..._wire.ids import ProcId
from ..._wire.protocol import (
    PROTOCOL_VERSION,
    Hello,
    Message,
    Refused,
    Route,
    Welcome,
    wire,
)
from .peers import _Peer

if TYPE_CHECKING:
    from ..._transport import inproc
    from ..._transport.conn import Batching

__all__ = ["Links"]

log = logging.getLogger("danaus.runtime")


class Links:
    """This proc's connections and the handshake on each (see the module docstring).

    ``peers``, ``lock``, ``exited`` and ``spares``: the runtime's peer table, its
    lock, the exits the host agent reported and the connections welcomed while
    their proc was held lost; ``peer_lost(name, reason)``; ``me()``:
    this proc's id; ``offload_hello(conn, extra)`` and ``hello_extra()``: the
    offloader's side of the handshake; ``relay_via()``, ``relay_dial(peer)``
    and ``relay_closed(conn, exc)``: the relay's; ``dispatch``: where frames
    go; ``notify_room()``: wake held-back senders; ``secret()``; ``closed()``:
    the runtime has closed; ``forget_handshake(conn)``: the listeners'
    unauthenticated connection is gone; ``direct_frame``: what a thread that
    reads a connection itself does with a frame (None: no direct reads).
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        host: str,
        network: inproc.Network,
        batching: Batching,
        peers: dict[str, _Peer],
        lock: threading.RLock,
        exited: dict[str, str],
        *,
        spares: dict[str, Connection],
        me: Callable[[], ProcId],
        peer_lost: Callable[[str, str], None],
        offload_hello: Callable[[Connection, tuple[Any, ...]], None],
        hello_extra: Callable[[], tuple[Any, ...]],
        relay_via: Callable[[], Any],
        relay_dial: Callable[[_Peer], None],
        relay_closed: Callable[[Connection, BaseException | None], None],
        dispatch: Callable[[Connection, Frame], None],
        notify_room: Callable[[], None],
        secret: Callable[[], bytes | None],
        closed: Callable[[], bool],
        forget_handshake: Callable[[Connection], object],
        direct_frame: Callable[[Connection, Frame], bool] | None,
    ) -> None:
        self.loop = loop
        self._host = host
        self._network = network
        self._batching = batching
        self._peers = peers
        self._lock = lock
        self._exited = exited
        self._me = me
        self._peer_lost = peer_lost
        self._offload_hello = offload_hello
        self._hello_extra = hello_extra
        self._relay_via = relay_via
        self._relay_dial = relay_dial
        self._relay_closed = relay_closed
        self._dispatch = dispatch
        self._notify_room = notify_room
        self._secret = secret
        self._closed = closed
        self._forget_handshake = forget_handshake
        self._direct_frame = direct_frame
        self.outgoing: set[Connection] = set()  # connections we dialled, open
        self.incoming: set[Connection] = set()  # connections others dialled, open
        self._spares = spares  # welcomed while we held their proc lost (the peer table's)
        self._aliases: dict[Connection, str] = {}  # dialled by address: the name it answered
        # The names, besides the one it was dialled as, that share a connection.
        self._sharers: dict[Connection, list[str]] = {}

    def all_connections(self) -> list[Connection]:
        """Every open connection: dialled, accepted, established or not (a snapshot)."""
        return [c for c in [*self.outgoing, *self.incoming] if not c.closed]

    def connections(self) -> list[tuple[str, str, Connection]]:
        """``(peer proc name, "out" | "in", connection)`` for every open connection
        whose peer said who it is; "out" when we dialled it. Both directions of
        the traffic with that peer go on it."""
        out = [(c.peer.name, "out", c) for c in list(self.outgoing) if c.peer is not None]
        out += [(c.peer.name, "in", c) for c in list(self.incoming) if c.peer is not None]
        return [(name, d, c) for name, d, c in out if not c.closed]

    def flushed(self) -> bool:
        """True once every connection is closed (after ``close()``)."""
        return not self.all_connections()

    def accepted(self, conn: Connection) -> None:
        """A connection another proc dialled (or relayed to us): ours to read."""
        self.allow_direct(conn)
        self.incoming.add(conn)

    def on_hello(self, conn: Connection, msg: Message) -> None:
        """A proc dialled us. We answer ``WELCOME`` and send to it on this connection
        from now on, unless one of these holds:

        - it speaks another protocol version: ``REFUSED``, and it is lost;
        - we share a connection with it already, or hold it lost: welcomed, and its
          frames are read, but we keep sending on the connection we have (none for a
          lost proc; ``forget_peer`` takes this one up if it comes back);
        - our own dial to it is in flight too (both dialled at once): the dial of
          the proc with the smaller name wins. If that is ours, this connection
          stays unanswered (the other side closes it once ours reaches it; if ours
          fails, we welcome this one instead); if it is theirs, we welcome this one
          and close our dial, on which nothing but ``HELLO`` went.
        """
        hello: Hello = msg.header
        if hello.version != PROTOCOL_VERSION:
            reason = (
                f"proc {self._me().name} speaks danaus protocol version {PROTOCOL_VERSION} "
                f"but proc {hello.proc.name} speaks version {hello.version}: run the same "
                "danaus release on every host"
            )
            log.error("refusing a connection: %s", reason)
            conn.send(encode_frame(wire(Refused(reason))))
            conn.flush_and_close()
            self._peer_lost(hello.proc.name, reason)  # whatever waits on it hears why, now
            return
        conn.peer = hello.proc
        name = hello.proc.name
        if name == self._me().name:
            # We dialled ourselves (an actor sending to one of this proc's actors):
            # our dialled end sends, this end only reads.
            self._welcome(conn)
            return
        with self._lock:
            peer = self._peers.get(name)
            if peer is None:
                peer = self._peers[name] = _Peer(hello.proc, pending=False)
            if peer.lost is not None or peer.link is not None:
                action = "spare"
                if peer.lost is not None:
                    self._spares[name] = conn
            elif peer.dialing is not None and self._me().name < name:
                action = "wait"
                peer.waiting = conn
            else:
                action = "adopt"
        self._offload_hello(conn, hello.offload)
        if action == "spare":
            self._welcome(conn)
        elif action == "adopt":
            self.adopt(peer, conn)

    def _welcome(self, conn: Connection) -> bool:
        try:
            conn.send(encode_frame(wire(Welcome(self._me(), self._hello_extra()))))
            return True
        except Exception:
            return False  # closed meanwhile: its close handler tells whoever waits

    def adopt(self, peer: _Peer, conn: Connection, welcome: bool = True) -> None:
        """Welcome ``conn``, dialled by ``peer``, and make it our connection to it."""
        with self._lock:
            loser, peer.dialing = peer.dialing, None
            peer.waiting = None
        if loser is not None:
            self.outgoing.discard(loser)
            loser.close()  # nothing but HELLO went on it
        if not welcome or self._welcome(conn):
            self._establish(peer, conn)

    def on_welcome(self, conn: Connection, msg: Message) -> None:
        """The proc we dialled took our connection for both directions."""
        welcome: Welcome = msg.header
        if conn.peer is None or conn not in self.outgoing:
            log.error("a WELCOME on a connection we did not dial, from %s", welcome.proc.name)
            return
        dialled = conn.peer.name
        with self._lock:
            peer = self._peers.get(dialled)
            if peer is None or peer.dialing is not conn:
                return  # a dial we gave up (theirs won, or the proc was lost)
            peer.dialing = None
            waiting, peer.waiting = peer.waiting, None
            alias = None
            reuse = None
            if welcome.proc.name != dialled:
                # Dialled by address under a provisional name (attaching to a worker):
                # the connection serves the proc's real name too, unless that has one.
                other = self._peers.get(welcome.proc.name)
                if other is None:
                    other = self._peers[welcome.proc.name] = _Peer(welcome.proc, pending=False)
                if (
                    other.link is None
                    and other.dialing is None
                    and other.lost is None
                    and not other.pending
                ):
                    alias = other
                    self._aliases[conn] = welcome.proc.name
                elif other.lost is None and other.link is not None and not other.link.closed:
                    # Attached again to a proc we share a connection with: the
                    # provisional name uses that one, and this one goes (the proc only
                    # reads it, and would keep it open, as we would, for nothing).
                    # It is lost with that one (else it kept the closed connection).
                    reuse = other.link
                elif other.lost is not None and (other.link is None or other.link.closed):
                    # A worker we hold lost, attached again (back after a partition):
                    # this connection is the spare that ``forget_peer`` (which the
                    # attach calls next) takes up as the worker's own, so that neither
                    # a dial to its name nor a later attach opens one more for the
                    # session; its close loses the worker again.
                    self._spares[welcome.proc.name] = conn
                    self._aliases[conn] = welcome.proc.name
            if reuse is not None:
                self._sharers.setdefault(reuse, []).append(dialled)
        if waiting is not None:
            waiting.close()  # theirs lost to ours: they close it too
        if reuse is not None:
            self._establish(peer, reuse)
            conn.close()
            return
        self._establish(peer, conn)
        if alias is not None:
            self._establish(alias, conn)
        self._offload_hello(conn, welcome.offload)

    def _establish(self, peer: _Peer, conn: Connection) -> None:
        """``conn`` is our connection to ``peer``; frames go on it unless it is pending."""
        with self._lock:
            peer.link = conn
        conn.on_drained = self._notify_room
        if not peer.pending:
            self.publish(peer)

    def publish(self, peer: _Peer) -> None:
        """Let frames go on ``peer.link``: first those queued, then any sender's."""
        with self._lock:
            conn = peer.link
            if conn is None or peer.conn is conn:
                return
            # Flush under the lock, before publishing the connection: a sender on
            # another thread must not overtake the frames queued before it.
            for parts, _, on_left in peer.queue:
                try:
                    conn.send(parts, on_left)
                except Exception:
                    break  # closed: its close handler reports the loss to the queue's owners
            else:
                peer.queue = []
                peer.queued_bytes = 0
            peer.conn = conn
        self._notify_room()

    def on_refused(self, conn: Connection, msg: Message) -> None:
        """The peer refused our connection: it is lost, for the reason it gave."""
        reason: str = msg.header.reason
        conn.fail_now(reason)
        if conn.peer is not None:
            self._peer_lost(conn.peer.name, reason)

    def allow_direct(self, conn: Connection) -> None:
        if config.get("direct_read"):
            conn.direct_frame = self._direct_frame

    def on_closed(self, conn: Connection, exc: BaseException | None) -> None:
        """A connection closed (I/O thread). If it was our connection to a peer, the
        peer is lost: everything it sent us came before this EOF, on this same
        connection, so nothing it sent is still on its way."""
        self.incoming.discard(conn)
        self.outgoing.discard(conn)
        self._forget_handshake(conn)
        alias = self._aliases.pop(conn, None)
        proc = conn.peer
        with self._lock:
            sharers = self._sharers.pop(conn, [])
            if alias is not None and self._spares.get(alias) is conn:
                del self._spares[alias]  # closed before the attach took it up
        if proc is None:
            self._relay_closed(conn, exc)  # a gateway connection, or one relayed through it
            return
        if self._closed():
            return
        lost: list[str] = []
        failed: list[str] = []
        retry = None
        with self._lock:
            if self._spares.get(proc.name) is conn:
                del self._spares[proc.name]
            for name in [proc.name, *([] if alias is None else [alias]), *sharers]:
                peer = self._peers.get(name)
                if peer is None:
                    continue
                if peer.waiting is conn:
                    peer.waiting = None
                if peer.link is conn:
                    lost.append(name)
                elif peer.dialing is conn:
                    peer.dialing = None
                    if peer.waiting is not None and not peer.waiting.closed:
                        retry = peer  # our dial failed, theirs waits: take theirs
                    else:
                        failed.append(name)
        if retry is not None and retry.waiting is not None:
            self.adopt(retry, retry.waiting)
        for name in failed:  # refused, reset, or it failed our handshake (a wrong secret)
            self._lose_soon(name, f"the connection to proc {name} broke: {exc}")
        for name in lost:
            peer = self._peers.get(name)
            if peer is not None and peer.stopping:
                reason = "it stopped"
            elif exc is None or "EOF" in str(exc):
                reason = "its process exited"
            else:
                reason = str(exc)  # e.g. no heartbeat: partitioned or frozen, maybe still alive
            self._lose_soon(name, f"the connection to proc {name} closed: {reason}")

    def _lose_soon(self, name: str, reason: str) -> None:
        peer = self._peers.get(name)
        if peer is not None and peer.spawned and not peer.stopping and name not in self._exited:
            # Wait briefly for the host agent's report of how it exited (it usually
            # comes within a millisecond) before declaring it lost on the strength
            # of a closed connection alone.
            grace = config.get("exit_report_grace")
            self.loop.call_later(grace, self._peer_lost, name, reason)
        else:
            self._peer_lost(name, reason)

    def connect(self, peer: _Peer) -> None:
        """Dial ``peer`` (I/O thread). Only ``HELLO`` goes on the connection until the
        peer answers ``WELCOME``; queued frames wait in ``peer.queue`` till then."""
        if (
            peer.conn is not None
            or peer.link is not None
            or peer.dialing is not None
            or peer.lost is not None
            or peer.pending
        ):
            return
        try:
            entry = choose(peer.proc.addr, self._host, self._network)
            if entry.startswith("inproc:"):
                self._connect_inproc(peer, entry[len("inproc:") :])
                return
            if self._relay_via() is not None and not entry.startswith("unix:"):
                self._relay_dial(peer)  # an attached client reaches other hosts through it
                return
            route = entry.startswith("via:")  # a peer reached through a gateway's relay port
            conn = self.dial(entry[len("via:") :] if route else entry, self._dispatch)
        except Exception as e:  # refused, no route, bad TLS files ...: never strand the queue
            self._peer_lost(peer.proc.name, f"cannot connect to proc {peer.proc.name}: {e}")
            return
        self.allow_direct(conn)
        if route:
            try:  # before HELLO: whom the gateway is to relay this connection to
                conn.send(encode_frame(wire(Route(peer.proc))))
            except Exception:  # closed at once: the HELLO below reports it
                log.debug("a ROUTE to %s could not be sent", peer.proc.name, exc_info=True)
        self.dialing(peer, conn, self._hello_extra())

    def dial(self, entry: str, on_frame: Callable[[Connection, Frame], None]) -> Connection:
        """A connection to address entry ``entry`` (``unix:`` or ``tcp://``; I/O thread)
        whose frames go to ``on_frame``; authenticated with the job secret over TCP.
        Raises ``OSError`` (refused, no route) or what TLS set-up raises."""
        s = connect_socket(entry)
        tcp = entry.startswith("tcp://")
        secret = self._secret()
        hs = Handshake(secret, "client") if tcp and secret is not None else None
        try:
            conn = Connection(
                s,
                self.loop,
                on_frame,
                self.on_closed,
                handshake=hs,
                tls=tls.client_context() if tcp else None,
                batching=self._batching,
            )
        except BaseException:
            s.close()
            raise
        conn.tcp = tcp
        self.outgoing.add(conn)
        return conn

    def accept_relayed(self, conn: Any) -> None:
        """A relayed connection a proc dialled to us through the gateway (I/O thread)."""
        conn.bind(self._dispatch, self.on_closed)
        self.incoming.add(conn)

    def _connect_inproc(self, peer: _Peer, name: str) -> None:
        conn: Any = self._network.connect(
            name,
            self.loop,
            self._dispatch,  # type: ignore[arg-type]
            self.on_closed,  # type: ignore[arg-type]
        )
        self.dialing(peer, conn, ())

    def dialing(self, peer: _Peer, conn: Connection, offload: tuple[Any, ...]) -> None:
        conn.peer = peer.proc
        self.outgoing.add(conn)
        with self._lock:
            peer.dialing = conn
        try:
            conn.send(encode_frame(wire(Hello(self._me(), PROTOCOL_VERSION, offload))))
        except Exception as e:  # it closed at once (before its close could name the peer)
            self.on_closed(conn, conn.close_exc or e)
