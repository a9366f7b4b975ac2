"""Relaying through a gateway: a client that the procs cannot reach (``attach``).

A part of `Runtime` (``calls.relay``),
in two roles. A client that called ``attach(addr)`` dials the worker at
``addr`` and sends ``GATEWAY`` instead of ``HELLO``; the worker, now its
*gateway*, opens a relay port for it and answers ``GATEWAY_OK`` with that
port's address. From then on the gateway connection carries all of the
client's traffic with procs on other hosts:

- the client dials no proc over TCP. To reach one it opens a *relayed
  connection*: ``OPEN(chan, proc)`` on the gateway connection; the gateway
  dials the proc and copies frames both ways as ``RELAYED(chan, header)``
  with the frame's own body and buffers; a close at either end is
  ``SHUT(chan, reason)``;
- the client advertises ``via:`` and the relay port instead of a TCP address,
  and so do the procs it spawns on its own host. A proc that dials one of them
  connects to the relay port and sends ``ROUTE(target)`` before its
  ``HELLO``; the gateway opens a relayed connection toward the client
  (``OPEN`` from its side), which takes it itself (the target is the client)
  or pipes it to the local proc over its Unix socket.

At the client a relayed connection is a `RelayedConnection`, which the
runtime uses like any other: a peer's frames keep their order (one gateway
connection, one real connection beyond it), and the peer is lost when its
connection closes. When the gateway connection breaks every relayed
connection closes with it, so every peer reached through it is lost and
whatever waited on them fails with ``SupervisionError``. Heartbeats are each
hop's own: the gateway connection and the gateway's connections to procs are
watched, and PINGs are not relayed.

Its methods run on the I/O thread, except `Relay.attach()` (a user thread).
"""

from __future__ import annotations

import functools
import itertools
import logging
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from ..._errors import ConnectionClosedError, PeerBrokenError
from ..._transport.address import choose
from ..._transport.inproc import InprocConnection
from ..._wire.frame import Frame, decode_frame, encode_frame
from ..._wire.protocol import (
    PROTOCOL_VERSION,
    Gateway,
    GatewayOk,
    Kind,
    Message,
    Open,
    Refused,
    Shut,
    decode,
    wire,
)
from .faces import RelayCalls

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

    from ..._transport.conn import Connection
    from .peers import _Peer

__all__ = ["Relay", "RelayedConnection"]

log = logging.getLogger("danaus.runtime")

_RELAYED = int(Kind.RELAYED)
_PING = int(Kind.PING)


class _Side:
    """One gateway connection (at the client or at the gateway): the relayed
    connections it carries, by channel. The client numbers the channels it opens
    even, the gateway odd, so the two never pick the same one."""

    __slots__ = ("chans", "ctl", "ends", "listener")

    def __init__(self, ctl: Connection, first: int) -> None:
        self.ctl = ctl
        self.ends: dict[int, Any] = {}  # chan -> RelayedConnection (client) or Connection
        self.chans = itertools.count(first, 2)
        self.listener: Any = None  # the gateway's relay port for this client


class RelayedConnection(InprocConnection):
    """A connection with a proc through the gateway (client side).

    The runtime uses it like any connection; its frames travel as ``RELAYED``
    frames on the gateway connection. ``tcp`` is None (as for an in-process
    connection): the runtime hands it frames without encoding them, and its
    heartbeat leaves it alone (the gateway connection is watched instead).
    """

    def __init__(self, relay: Relay, side: _Side, chan: int) -> None:
        super().__init__(relay.calls.loop)
        self._relay = relay
        self._side = side
        self.chan = chan

    @property
    def backlog_bytes(self) -> int:  # type: ignore[override]
        """What the gateway connection holds back: senders to this peer wait for it."""
        return int(self._side.ctl.backlog_bytes)

    def want_drain(self, low: int) -> None:
        self._side.ctl.want_drain(low)

    def send(
        self, parts: list[Any], on_left: Callable[[], None] | None = None, *, copy: bool = False
    ) -> None:
        """Send one encoded frame (HELLO, WELCOME, frames queued before the connection);
        ``on_left()`` once ``parts`` are no longer needed (at once: they are copied)."""
        if self.closed:
            raise ConnectionClosedError("closed by us") from self.close_exc
        frame = decode_frame(b"".join(parts))
        self._forward(frame.header, frame.body, frame.buffers)
        if on_left is not None:
            on_left()

    def send_message(
        self, header: tuple[Any, ...], body: ReadableBuffer, buffers: Iterable[ReadableBuffer]
    ) -> None:
        """Send a frame given its wire header: encoded once, inside the RELAYED frame."""
        if self.closed:
            raise ConnectionClosedError("closed by us") from self.close_exc
        self._forward(header, body, buffers)

    def _forward(
        self, header: tuple[Any, ...], body: ReadableBuffer, buffers: Iterable[ReadableBuffer]
    ) -> None:
        self.frames_sent += 1
        self.last_send = self.loop.time()
        bufs = list(buffers)
        self._side.ctl.send(encode_frame((_RELAYED, self.chan, header), memoryview(body), bufs))

    def _close(self, exc: BaseException | None) -> None:
        if self.closed:
            return
        self.closed = True
        self.close_exc = exc if exc is not None else ConnectionClosedError("closed by us")
        self._relay._end_closed(self._side, self.chan, self, exc)
        if self._on_close is not None:
            self._on_close(self, exc)


class Relay:
    """This runtime's gateway connections and the connections relayed through them."""

    def __init__(self, calls: RelayCalls) -> None:
        self.calls = calls
        self.sides: dict[Any, _Side] = {}  # gateway connection -> its side (either role)
        self.pipes: dict[Any, tuple[_Side, int]] = {}  # a real relayed connection -> where
        self.via: str | None = None  # client: "via:tcp://..." once attached
        self.gateway: _Side | None = None  # client: its gateway connection
        self.lost: str | None = None  # client: why the gateway connection closed
        # client, while attach() waits: (side, outcome list, event)
        self._attaching: tuple[_Side, list[str | None], threading.Event] | None = None
        calls.register(Kind.GATEWAY, self._on_gateway)
        calls.register(Kind.GATEWAY_OK, self._on_gateway_ok)
        on_side = self._on_side_frame  # each handler gets the gateway connection's side
        calls.register(Kind.OPEN, functools.partial(on_side, self._on_open))
        calls.register(Kind.RELAYED, functools.partial(on_side, self._on_relayed))
        calls.register(Kind.SHUT, functools.partial(on_side, self._on_shut))
        calls.register(Kind.ROUTE, self._on_stray_route)

    # -- the client ------------------------------------------------------------

    def attach(self, addr: str, timeout: float) -> None:
        """Make the worker at ``addr`` (``tcp://HOST:PORT``) this client's gateway.

        Call from a thread other than the I/O thread, before this client's
        address travels. Raises ``RuntimeError`` with the reason if the worker
        cannot be reached, refuses, or does not answer within ``timeout`` s.
        """
        done = threading.Event()
        outcome: list[str | None] = []
        conns: list[Connection] = []

        def start() -> None:
            calls = self.calls
            try:
                conn = calls.dial(addr, calls.dispatch)
            except Exception as e:
                outcome.append(f"cannot connect to {addr}: {e}")
                done.set()
                return
            conns.append(conn)
            side = _Side(conn, 2)
            self.sides[conn] = side
            self._attaching = (side, outcome, done)
            conn.on_drained = calls.notify_room
            try:
                conn.send(encode_frame(wire(Gateway(calls.me(), PROTOCOL_VERSION))))
            except Exception:
                log.debug("the gateway connection to %s closed at once", addr, exc_info=True)

        self.calls.call_soon(start)
        if not done.wait(timeout):

            def give_up() -> None:  # on the I/O thread, so it cannot cross GATEWAY_OK
                attaching = self._attaching
                if outcome or attaching is None or attaching[1] is not outcome:
                    return  # answered meanwhile
                self._attaching = None
                outcome.append(f"the worker did not answer within {timeout:g} s")
                for conn in conns:
                    conn.fail_now(f"no answer within {timeout:g} s")
                done.set()

            self.calls.call_soon(give_up)
            if not done.wait(timeout):  # the I/O thread itself is stuck
                outcome.append(f"the worker did not answer within {timeout:g} s")
        if outcome and outcome[0] is not None:
            raise RuntimeError(
                f"attach({addr!r}) failed: {outcome[0]}. Check that `danaus worker` runs "
                "there and that this client has its job secret (DANAUS_SECRET)"
            )

    def _on_gateway_ok(self, conn: Connection, msg: Message) -> None:
        attaching = self._attaching
        side = self.sides.get(conn)
        if side is None or attaching is None or attaching[0] is not side:
            conn.fail_now("GATEWAY_OK on a connection that asked for no gateway")
            return
        self._attaching = None
        self.gateway = side
        self.via = "via:" + msg.header.relay
        self.calls.advertise_via(self.via)
        attaching[1].append(None)
        attaching[2].set()

    def dial(self, peer: _Peer) -> None:
        """Open a relayed connection to ``peer`` and say HELLO on it (client)."""
        calls = self.calls
        side = self.gateway
        name = peer.proc.name
        if side is None or side.ctl.closed:
            calls.peer_lost(
                name, f"cannot connect to proc {name}: the gateway is lost: {self.lost}"
            )
            return
        chan = next(side.chans)
        conn = RelayedConnection(self, side, chan)
        conn.bind(calls.dispatch, calls.conn_closed)
        side.ends[chan] = conn
        try:
            side.ctl.send(encode_frame(wire(Open(chan, peer.proc))))
        except Exception as e:
            side.ends.pop(chan, None)
            calls.peer_lost(name, f"cannot connect to proc {name}: the gateway is lost: {e}")
            return
        calls.dialing(peer, conn, ())

    # -- the gateway -------------------------------------------------------------

    def _on_gateway(self, conn: Connection, msg: Message) -> None:
        """A client asks this worker to be its gateway."""
        proc, version = msg.header
        calls = self.calls
        reason = None
        if version != PROTOCOL_VERSION:
            reason = (
                f"proc {calls.me().name} speaks danaus protocol version {PROTOCOL_VERSION} "
                f"but client {proc.name} speaks version {version}: run the same danaus "
                "release on every host"
            )
        elif not conn.tcp or calls.tcp_advertise() is None or conn in self.sides or conn.peer:
            reason = f"proc {calls.me().name} is not a worker listening on TCP: no gateway"
        if reason is not None:
            conn.send(encode_frame(wire(Refused(reason))))
            conn.flush_and_close()
            return
        side = _Side(conn, 1)
        try:
            side.listener, relay = calls.open_relay_port(functools.partial(self._routed, side))
        except OSError as e:
            conn.send(encode_frame(wire(Refused(f"no relay port: {e}"))))
            conn.flush_and_close()
            return
        self.sides[conn] = side
        conn.on_drained = calls.notify_room
        log.info("gateway for client %s, relay port %s", proc.name, relay)
        conn.send(encode_frame(wire(GatewayOk(calls.me(), relay))))

    def _routed(self, side: _Side, conn: Connection, frame: Frame) -> None:
        """A frame on a connection to the relay port: the first names its target."""
        pipe = self.pipes.get(conn)
        if pipe is not None:
            self._piped(side, pipe[1], conn, frame)
            return
        try:
            msg = decode(frame)
        except Exception as e:  # ProtocolError, or whatever else a bad header raises
            log.error("closing a connection to relay port %s: %s", side.listener, e)
            conn.fail_now(f"protocol error: {e}")
            return
        if msg.kind is not Kind.ROUTE:
            conn.fail_now(f"a relay port's first frame must be ROUTE, not {msg.kind.name}")
            return
        if side.ctl.closed:
            conn.fail_now("the client of this relay port is gone")
            return
        chan = next(side.chans)
        side.ends[chan] = conn
        self.pipes[conn] = (side, chan)
        try:
            side.ctl.send(encode_frame(wire(Open(chan, msg.header.target))))
        except Exception:
            conn.fail_now("the client of this relay port is gone")

    def _on_stray_route(self, conn: Connection, msg: Message) -> None:
        conn.fail_now("ROUTE on a connection that is not to a relay port")

    # -- both roles ------------------------------------------------------------------

    def _on_side_frame(
        self, on_side: Callable[[_Side, Message], None], conn: Connection, msg: Message
    ) -> None:
        """A frame only a gateway connection carries (OPEN, RELAYED, SHUT): to
        ``on_side(side, msg)``; on any other connection, it fails that connection."""
        side = self.sides.get(conn)
        if side is None:
            conn.fail_now(f"{msg.kind.name} on a connection that is no gateway connection")
            return
        on_side(side, msg)

    def _on_open(self, side: _Side, msg: Message) -> None:
        """The other end opens relayed connection ``chan`` to ``target``."""
        chan, target = msg.header
        calls = self.calls
        if side is self.gateway and target.name == calls.me().name:
            end = RelayedConnection(self, side, chan)  # a proc dialled this client
            side.ends[chan] = end
            calls.accept_relayed(end)
            return
        try:
            entry = choose(target.addr, calls.host, calls.inproc)
            if side is self.gateway and not entry.startswith("unix:"):
                raise OSError(f"proc {target.name} is not on this host")
            if entry.startswith("via:"):
                raise OSError(f"proc {target.name} is reached through a gateway itself")
            pipe = calls.dial(entry, functools.partial(self._piped, side, chan))
        except Exception as e:
            self._shut(side, chan, f"cannot connect to proc {target.name}: {e}")
            return
        side.ends[chan] = pipe
        self.pipes[pipe] = (side, chan)

    def _piped(self, side: _Side, chan: int, conn: Connection, frame: Frame) -> None:
        """A frame from a real connection that is relayed: onto the gateway connection."""
        header = frame.header
        if header[0] == _PING:
            return  # heartbeats are each hop's own
        try:
            side.ctl.send(encode_frame((_RELAYED, chan, header), frame.body, frame.buffers))
        except Exception:
            log.debug("the gateway connection closed under relayed frames", exc_info=True)

    def _on_relayed(self, side: _Side, msg: Message) -> None:
        chan, header = msg.header
        end = side.ends.get(chan)
        if end is None:
            return  # closed meanwhile: the SHUTs crossed
        if type(end) is RelayedConnection:
            end._receive(Frame(header, msg.body, msg.buffers))
            return
        try:
            end.send(encode_frame(header, msg.body, msg.buffers))
        except Exception:
            log.debug("a relayed connection closed under a frame", exc_info=True)

    def _on_shut(self, side: _Side, msg: Message) -> None:
        chan, reason = msg.header
        end = side.ends.pop(chan, None)
        if type(end) is RelayedConnection:
            end._close(PeerBrokenError(reason))
        elif end is not None:
            self.pipes.pop(end, None)
            end.flush_and_close()  # what came before the SHUT goes out first

    def _shut(self, side: _Side, chan: int, reason: str) -> None:
        if side.ctl.closed:
            return
        try:
            side.ctl.send(encode_frame(wire(Shut(chan, reason))))
        except Exception:
            log.debug("the gateway connection closed before a SHUT", exc_info=True)

    def _end_closed(
        self, side: _Side, chan: int, end: RelayedConnection, exc: BaseException | None
    ) -> None:
        """A relayed connection closed here: tell the other end, unless it told us."""
        if side.ends.get(chan) is end:
            del side.ends[chan]
            self._shut(side, chan, "connection closed by peer (EOF)" if exc is None else str(exc))

    def closed(self, conn: Connection, exc: BaseException | None) -> None:
        """A connection without a peer closed (runtime): a gateway connection or a pipe."""
        side = self.sides.pop(conn, None)
        if side is not None:
            self._side_closed(side, exc)
            return
        pipe = self.pipes.pop(conn, None)
        if pipe is not None:
            side, chan = pipe
            if side.ends.get(chan) is conn:
                del side.ends[chan]
                why = "connection closed by peer (EOF)" if exc is None else str(exc)
                self._shut(side, chan, why)

    def _side_closed(self, side: _Side, exc: BaseException | None) -> None:
        """A gateway connection closed: so does everything relayed through it."""
        # Not "EOF": a proc reached through the gateway lost its route, not its life.
        what = "it closed" if exc is None or "EOF" in str(exc) else str(exc)
        reason = f"lost the gateway connection ({what})"
        attaching = self._attaching
        if attaching is not None and attaching[0] is side:
            self._attaching = None
            attaching[1].append(f"the connection closed: {exc or 'EOF'}")
            attaching[2].set()
        if side is self.gateway:
            self.lost = reason
        if side.listener is not None:
            self.calls.close_relay_port(side.listener)
            side.listener = None
        ends, side.ends = side.ends, {}
        for end in ends.values():
            if type(end) is RelayedConnection:
                end._close(PeerBrokenError(reason))
            else:
                self.pipes.pop(end, None)
                end.flush_and_close()

    def close(self) -> None:
        """The runtime closes: stop listening on the relay ports (I/O thread)."""
        for side in list(self.sides.values()):
            if side.listener is not None:
                self.calls.close_relay_port(side.listener)
                side.listener = None
