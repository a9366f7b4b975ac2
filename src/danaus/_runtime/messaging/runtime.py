"""The runtime of one proc: its I/O loop, its peers, its ports and its mailboxes.

Every danaus process (the client, a host agent, a spawned proc) runs exactly
one `Runtime`. It listens on one address, shares one connection with
each peer proc, whichever of the two dialled it, for frames both ways (so
each sender→receiver pair is FIFO, and a peer's EOF comes after everything
it sent), and routes each incoming frame by its kind (the table and the
headers are in ``danaus._wire.protocol``)::

    CALL   -> a local mailbox (an actor)
    REPLY  -> a local port
    HELLO  -> names the proc that dialled us; we answer WELCOME and use the
              connection both ways, or REFUSED if it speaks another protocol
              version (when both dialled at once, see ``links.Links.on_hello``)
    WELCOME-> the proc we dialled took the connection: frames may go on it
    READY  -> a proc we are waiting for is up (or failed to boot)
    LOST   -> the host agent saw a proc exit
    other  -> the one handler a higher layer registered for the kind
              (``register``; a second registration for a kind is refused)

A composition root: each concern is a part that the runtime builds and
hands the callables it needs, never itself, so no part reaches through
another (the offloader, cast tree and relay get records of them: faces.py).
Callers use the part they need: ``peers`` (peers.py), ``listeners``
(listening.py), ``links`` (links.py: one connection per peer), ``sender``
(sending.py; ``send`` is its method), ``router`` (routing.py: ports and
mailboxes), ``backpressure``, ``heartbeat`` (liveness.py), ``observing``
(metrics.py), ``offload``, ``tree``, ``relay``.

Failure detection: a peer is *lost* when our connection with it hits EOF or
an error, when connecting to it is refused, or when the host agent reports its
exit. Everything waiting on a lost peer is told at once (ports watching it,
frames queued for it); a lost peer never comes back, since proc names are
never reused.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ... import _config as config
from ..._errors import SupervisionError
from ..._transport.address import host_token, join
from ..._transport.conn import Connection
from ..._transport.state import Transport
from ..._wire import codec
from ..._wire.frame import Frame
from ..._wire.ids import PortId, ProcId
from ..._wire.protocol import (
    STATUS_ERROR,
    STATUS_EXC,
    STATUS_OK,
    Kind,
    Message,
    Reply,
    decode,
)
from . import liveness
from .backpressure import Backpressure
from .faces import OffloadCalls, RelayCalls, TreeCalls
from .gathers import GatherCalls
from .links import Links
from .listening import Listeners
from .metrics import Observing, Tracer
from .offload import Offloader
from .peers import PeerTable
from .relay import Relay
from .routing import Mailbox, PortHandler, Router
from .sending import Sender
from .tree import TreeRouter

if TYPE_CHECKING:
    from ..._wire.ids import ActorId

__all__ = [
    "STATUS_ERROR",
    "STATUS_EXC",
    "STATUS_OK",
    "Handler",
    "Mailbox",
    "PortHandler",
    "Runtime",
]

log = logging.getLogger("danaus.runtime")

# out of file descriptors, stop accepting for this long (doubling up to the max).
ACCEPT_BACKOFF, ACCEPT_BACKOFF_MAX = 0.01, 1.0


Handler = Callable[[Connection, Message], None]


# Looked for once, at import (the zygote imports this module before it forks): a
# failed import is not cached, and trying again in every proc searched sys.path anew.
try:
    import uvloop as _uvloop
except ImportError:
    _uvloop = None


def _new_loop() -> asyncio.AbstractEventLoop:
    if _uvloop is not None:
        return _uvloop.new_event_loop()  # type: ignore[no-any-return]
    return asyncio.new_event_loop()


class Runtime:
    """One proc's runtime. Build it, ``start()`` it, then use it from any thread."""

    def __init__(
        self,
        name: str,
        job_dir: str,
        *,
        secret: bytes | None = None,
        host: str | None = None,
        insecure: bool = False,
        boot: dict[str, Any] | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
        inproc: bool = False,
        transport: Transport | None = None,
    ) -> None:
        """``inproc=True`` makes a proc that lives in this process: it listens on
        ``inproc:NAME`` instead of a Unix socket and runs on ``loop`` (which
        several such runtimes may share; see ``danaus._transport.inproc``).

        Its inputs: ``secret`` (the job secret; `set_secret()` sets one
        later), ``insecure`` (may listen on TCP without a secret;
        `allow_insecure()` later) and ``boot`` (how a spawned proc was
        started; empty in the client). Higher layers never set attributes on a
        runtime: what the runtime calls back (`set_bounce_handler()`,
        `set_block_hook()`) and the running trace (`set_tracer()`) are
        registered through these methods.

        ``transport`` is the transport state to share (that of the runtime whose
        in-process network it joins); by default the runtime makes its own and
        releases it when it closes."""
        self.job_dir = job_dir
        self.inproc = inproc
        self.host = host or host_token()
        unix = f"inproc:{name}" if inproc else f"unix:{os.path.join(job_dir, name + '.sock')}"
        self.proc_id = ProcId(name, join(unix, f"host:{self.host}"))
        self.loop = loop if loop is not None else _new_loop()
        self.thread: threading.Thread | None = None
        self._owns_transport = transport is None
        self.transport = transport if transport is not None else Transport()
        network, batching = self.transport.inproc, self.transport.batching
        self.handlers: dict[Kind, Handler] = {}
        self.closed = False
        # how this proc was started (empty in the client); read it, never assign it
        self.boot: dict[str, Any] = boot if boot is not None else {}
        # Observing: endpoint metrics on or off, the recent rings, the STATS sections.
        self.observing = Observing(
            bool(config.get("metrics")),
            config.get("query_ring_size"),
            config.get("query_messages_per_s"),
        )
        # Read on hot paths, so a plain attribute: read it anywhere, set it with set_tracer().
        self.tracer: Tracer | None = None
        me = self._me
        # Routing to mailboxes and ports (routing.py); undeliverable messages are
        # returned through its bounce handler (set_bounce_handler()).
        self.router = Router(self.loop, self.proc_id, _log_bounce, self.undeliverable)
        # The peers: expected, ready, lost, and who waits on which (peers.py).
        self.peers = PeerTable(
            self.loop,
            me=me,
            call_soon=self.call_soon,
            connect=lambda peer: self.links.connect(peer),
            publish=lambda peer: self.links.publish(peer),
            adopt=lambda peer, conn, welcome: self.links.adopt(peer, conn, welcome),
            port=self.router.ports.get,
            open_ports=lambda: list(self.router.ports.items()),
            notify_room=lambda: self.backpressure.notify_room(),
        )
        peers = self.peers
        self.register(Kind.CALL, self.router.on_call)
        self.register(Kind.REPLY, self.router.on_reply)
        self.register(Kind.READY, peers.on_ready)
        self.register(Kind.LOST, peers.on_lost_report)
        self.register(Kind.PING, _ignore_frame)
        # Large buffers to peers on this host skip the socket (offload.py).
        self.offload = Offloader(
            OffloadCalls(
                loop=self.loop,
                me=me,
                register=self.register,
                on_peer_lost=peers.lost_callbacks.append,
                dispatch=self._dispatch,
                send=lambda *args, **kw: self.sender.send(*args, **kw),
                port=self.router.ports.get,
                bounce=self.router.bounce,
                undeliverable=self.undeliverable,
                notify_room=lambda: self.backpressure.notify_room(),
            )
        )
        offload = self.offload
        # Backpressure (backpressure.py): held-back senders, paused connections, waits.
        self.backpressure = Backpressure(
            self.loop,
            on_io_thread=self.on_io_thread,
            call_soon=self.call_soon,
            closed=lambda: self.closed,
            is_lost=peers.is_lost,
            offloaded=offload.held_of,
            flush_held=batching.flush_held,
        )
        # One connection per peer, dialled or accepted, and its handshake (links.py).
        self.links = Links(
            self.loop,
            self.host,
            network,
            batching,
            peers.table,
            peers.lock,
            peers.exited,
            spares=peers.spares,
            me=me,
            peer_lost=peers.peer_lost,
            offload_hello=offload.on_hello,
            hello_extra=offload.hello_extra,
            relay_via=lambda: self.relay.via,
            relay_dial=lambda peer: self.relay.dial(peer),
            relay_closed=lambda conn, exc: self.relay.closed(conn, exc),
            dispatch=self._dispatch,
            notify_room=self.backpressure.notify_room,
            secret=lambda: self.listeners.secret,
            closed=lambda: self.closed,
            forget_handshake=lambda conn: self.listeners.handshaking.pop(conn, None),
            direct_frame=self.router.direct_frame,
        )
        links = self.links
        self.register(Kind.HELLO, links.on_hello)
        self.register(Kind.WELCOME, links.on_welcome)
        self.register(Kind.REFUSED, links.on_refused)
        # Where this proc listens, and accepting connections (listening.py).
        self.listeners = Listeners(
            self.loop,
            name,
            unix,
            network,
            batching,
            secret=secret,
            insecure=insecure,
            accepted=links.accepted,
            dispatch=self._dispatch,
            on_closed=links.on_closed,
            call_on_loop=self._on_loop,
            closed=lambda: self.closed,
        )
        # Writes frames to peers from any thread (sending.py); ``send`` is its method.
        self.sender = Sender(
            peers.table,
            peers.lock,
            offloading=offload.ok_peers,
            offloaded=offload.held_of,
            wrap=offload.wrap,
            high=lambda: self.backpressure.send_high,
            wait_for_room=self.backpressure.wait_for_room,
            wait_sent=self.backpressure.wait_sent,
            on_io_thread=self.on_io_thread,
            call_soon=self.call_soon,
            connect=links.connect,
        )
        self.send = self.sender.send
        # CAST and GATHER: messages to many actors through a tree of procs (tree.py).
        self.tree = TreeRouter(
            TreeCalls(
                me=me,
                register=self.register,
                handler=self.handlers.get,
                send=self.send,
                reply=self.reply,
                bounce=self.router.bounce,
                resolve=peers.resolve,
                is_lost=peers.is_lost,
                deliver_call=self.router.deliver_call,
                port=self.router.ports.get,
                gather=GatherCalls(
                    open_port=self.router.open_port,
                    close_port=self.router.close_port,
                    watch=peers.watch,
                    unwatch=peers.unwatch,
                    send=self.send,
                ),
            )
        )
        # A gateway's relaying, or an attached client's (relay.py).
        self.relay = Relay(
            RelayCalls(
                loop=self.loop,
                me=me,
                host=self.host,
                inproc=network,
                tcp_advertise=lambda: self.listeners.tcp_advertise,
                call_soon=self.call_soon,
                register=self.register,
                dispatch=self._dispatch,
                dial=links.dial,
                dialing=links.dialing,
                conn_closed=links.on_closed,
                accept_relayed=links.accept_relayed,
                advertise_via=self.advertise_via,
                open_relay_port=self.listeners.open_relay_port,
                close_relay_port=self.listeners.close_relay_port,
                peer_lost=peers.peer_lost,
                notify_room=self.backpressure.notify_room,
            )
        )
        # Pings quiet connections, drops those whose peer is judged lost (liveness.py).
        self.heartbeat = liveness.Heartbeat(
            self.loop, links.all_connections, lambda: self.proc_id.name, lambda: self.closed
        )

    def _me(self) -> ProcId:
        """This proc's id: its address changes when it starts listening on TCP."""
        return self.proc_id

    # -- inputs and hooks: set through these methods, never by assignment from outside ---

    @property
    def secret(self) -> bytes | None:
        """The job secret that TCP peers must prove they hold (None: none yet)."""
        return self.listeners.secret

    def set_secret(self, secret: bytes) -> None:
        """Use job secret ``secret`` from now on (e.g. ``attach_to_workers(secret=...)``):
        connections made or accepted later authenticate with it."""
        self.listeners.secret = secret

    @property
    def insecure(self) -> bool:
        """Whether this runtime may listen on TCP without a secret."""
        return self.listeners.insecure

    def allow_insecure(self) -> None:
        """Let this runtime listen on TCP without a secret (``DANAUS_INSECURE=1``)."""
        self.listeners.insecure = True

    def set_bounce_handler(self, handler: Callable[[ActorId | None, str, str], None]) -> None:
        """``handler(sender, dest, reason)`` returns undeliverable messages to their
        senders from now on (the actor layer's; until then they are logged)."""
        self.router.set_bounce(handler)

    def bounce(self, sender: ActorId | None, dest: str, reason: str) -> None:
        """A message from ``sender`` to ``dest`` could not be delivered: return it."""
        self.router.bounce(sender, dest, reason)

    def set_block_hook(self, hook: Callable[[bool], None] | None) -> None:
        """``hook(True)`` before and ``hook(False)`` after a thread waits on a
        held-back send (the actor layer's: the blocked actor's inbox stops
        pausing connections meanwhile)."""
        self.backpressure.set_block_hook(hook)

    @property
    def held_back(self) -> int:
        """Sends that had to wait for a backlog to drain (a statistic)."""
        return self.backpressure.held_back

    @property
    def pauses(self) -> int:
        """Times a connection was paused for a full inbox (a statistic)."""
        return self.backpressure.pauses

    @property
    def waits(self) -> int:
        """Threads of this process blocked on a future or a held-back send."""
        return self.backpressure.waits

    def set_tracer(self, tracer: Tracer | None) -> Tracer | None:
        """Record spans into ``tracer`` from now on (None: stop); returns the one
        that ran until now."""
        old, self.tracer = self.tracer, tracer
        self.router.tracer = tracer
        return old

    def register(self, kind: Kind, handler: Handler) -> None:
        """Handle frames of ``kind`` with ``handler(conn, message)`` on the I/O thread.

        Raises ``RuntimeError`` if the kind already has a handler: each kind has
        exactly one owner, so two layers can never both think they own one.
        """
        if kind in self.handlers:
            raise RuntimeError(
                f"frame kind {Kind(kind).name} already has a handler "
                f"({self.handlers[kind]!r}); each kind has exactly one"
            )
        self.handlers[Kind(kind)] = handler

    # -- lifecycle --------------------------------------------------------

    def start(self, *, in_thread: bool) -> None:
        """Listen, and run the I/O loop in a daemon thread (client) or not yet (proc)."""
        self.listeners.listen(self.inproc)
        if not self.inproc:  # a proc in this process cannot freeze or vanish on its own
            self.heartbeat.start()
        if in_thread:
            self.thread = threading.Thread(
                target=self.loop.run_forever, name="danaus-io", daemon=True
            )
            self.thread.start()

    def listen_tcp(self, bind: str, advertise: str, port: int = 0) -> str:
        """Also accept TCP connections on ``bind:port``; advertise ``advertise`` to peers.

        Returns the advertised ``tcp://`` entry. Call before the address travels
        (it changes ``proc_id``). Every connection must prove it knows the job
        secret; raises ``RuntimeError`` if there is none (unless ``insecure``).
        """
        entry, new = self.listeners.listen_tcp(bind, advertise, port)
        if new:
            self._set_proc_id(join(self.listeners.unix, entry, f"host:{self.host}"))
        return entry

    @property
    def tcp_advertise(self) -> str | None:
        """The IP peers on other hosts reach us at (None: not listening on TCP)."""
        return self.listeners.tcp_advertise

    @property
    def tcp_bind(self) -> str | None:
        """The IP the TCP listener is bound to (None: not listening on TCP)."""
        return self.listeners.tcp_bind

    def listen_inproc(self) -> None:
        """Also accept in-process connections (``inproc:NAME``), from runtimes of this
        process (a simulated mesh). Changes ``proc_id``: call before the address travels.
        """
        if self.inproc or not self.listeners.listen_inproc():
            return
        self._set_proc_id(join(f"inproc:{self.proc_id.name}", self.proc_id.addr))

    def _set_proc_id(self, addr: str) -> None:
        """This proc is reached at ``addr`` from now on (before the address travels)."""
        self.proc_id = ProcId(self.proc_id.name, addr)
        self.router.me = self.proc_id

    def listen_tcp_also(self, ip: str) -> None:
        """Also accept TCP connections on interface ``ip``, at the same port (I/O thread safe).

        A client that attached workers on two networks (say loopback and a
        cluster network) is reached back by each on the interface it used to
        reach it; it listens on exactly those, never on every interface.
        Raises ``RuntimeError`` before ``listen_tcp``, ``OSError`` if the port
        is taken on ``ip``.
        """
        self.listeners.listen_tcp_also(ip)

    def _on_loop(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the I/O thread: now if this is it (or it has not started)."""
        if self.thread is not None and not self.on_io_thread():
            self.loop.call_soon_threadsafe(fn)
        else:
            fn()

    def on_io_thread(self) -> bool:
        try:
            return asyncio.get_running_loop() is self.loop
        except RuntimeError:
            return False

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the I/O thread (soon, in order)."""
        if self.on_io_thread():
            self.loop.call_soon(fn, *args)
        else:
            self.loop.call_soon_threadsafe(fn, *args)

    def close(self) -> None:
        """Stop listening and close every connection (I/O thread). Idempotent."""
        if self.closed:
            return
        self.closed = True
        self.listeners.close()
        self.relay.close()
        for conn in self.links.all_connections():
            conn.flush_and_close()
        if self._owns_transport:
            self.transport.close()  # what is held went out in flush_and_close

    # -- receiving ------------------------------------------------------------

    def flushed(self) -> bool:
        """True once every connection is closed (after ``close()``)."""
        return not self.links.all_connections()

    def _dispatch(self, conn: Connection, frame: Frame) -> None:
        try:
            msg = decode(frame)
        except Exception as e:  # ProtocolError, or whatever else a bad header raises
            # A peer that authenticated but does not speak our protocol: drop it, and only it.
            log.error("closing the connection from %s: %s", conn.peer, e)
            conn.fail_now(f"protocol error: {e}")
            return
        handler = self.handlers.get(msg.kind)
        if handler is None:
            log.error("no handler for frame kind %s from %s", msg.kind.name, conn.peer)
            return
        bp = self.backpressure
        outer, bp.delivering = bp.delivering, conn
        try:
            handler(conn, msg)
        except Exception:
            log.exception("danaus internal error while handling a %s frame", msg.kind.name)
        finally:
            bp.delivering = outer

    # -- direct reads (a waiting thread reads its own reply) -------------------

    def reader_for(self, proc: ProcId) -> Connection | None:
        """The connection to ``proc`` if a waiting thread may read it directly."""
        peer = self.peers.table.get(proc.name)
        conn = peer.conn if peer is not None else None
        return conn if getattr(conn, "direct_frame", None) is not None else None

    # -- sending ------------------------------------------------------------

    def outbound_bytes(self, name: str) -> int:
        """Bytes of frames to proc ``name`` this process still holds (queued, in its
        connection's backlog, offloaded and not yet read): a statistic."""
        peer = self.peers.table.get(name)
        return 0 if peer is None else self.backpressure.outbound(peer)

    # -- relaying (relay.py) ------------------------------------------------------

    def advertise_via(self, entry: str) -> None:
        """Be reached through a gateway's relay port (``via:tcp://...``) instead of TCP:
        an attached client, and the procs it spawns on its host. Call before the
        address travels (it changes ``proc_id``)."""
        self._set_proc_id(join(self.listeners.unix, entry, f"host:{self.host}"))

    # -- replies --------------------------------------------------------------

    def reply(
        self,
        port: PortId,
        index: int,
        status: int,
        value: object,
        on_fail: Callable[[str], None] | None = None,
    ) -> int:
        """Send ``value`` to ``port`` (any thread); unpicklable values become errors.

        Returns the bytes of the reply's body (its buffers not counted)."""
        tracer = self.tracer
        t0 = tracer.now() if tracer is not None else 0
        try:
            body, bufs = codec.dumps(value)
        except Exception as e:
            status = STATUS_EXC
            body, bufs = codec.dumps(
                TypeError(f"the reply could not be pickled: {type(e).__name__}: {e}")
            )
        if port.proc.name == self.proc_id.name:
            # A gather port of this proc's cast tree takes its own actor's reply directly.
            local = getattr(self.router.ports.get(port.port), "local_reply", None)
            if local is not None:
                local(index, status, body, bufs)
                return len(body)
        # The replying actor goes on and may change what it returned: ``send`` keeps
        # a snapshot of whatever it does not write at once (queued or offloaded).
        self.send(port.proc, Reply(port.port, index, status), body, bufs, on_fail or _ignore)
        if tracer is not None:
            flow = f"r:{port.proc.name}:{port.port}:{index}"
            tracer.span("reply", "reply", t0, {"bytes": len(body)}, flow_out=flow)
        return len(body)

    # -- undeliverable calls ------------------------------------------------

    def undeliverable(self, port: PortId | None, index: int, reason: str) -> None:
        """Answer a call that cannot be delivered with ``SupervisionError``."""
        if port is None:
            log.error("dropping a message that has neither a reply port nor a sender: %s", reason)
            return
        err = SupervisionError(f"message undeliverable: {reason}", reason=reason)
        self.reply(port, index, STATUS_ERROR, err)


def _ignore(reason: str) -> None:
    pass


def _ignore_frame(conn: Connection, msg: Message) -> None:
    pass


def _log_bounce(sender: ActorId | None, dest: str, reason: str) -> None:
    log.error("a message from %s to %s could not be delivered: %s", sender, dest, reason)
