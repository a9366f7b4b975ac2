"""The runtime of one proc: its I/O loop, its peers, its ports and its mailboxes.

Every danaus process (the client, a host agent, a spawned proc) runs exactly
one :class:`Runtime`. It listens on one address, shares one connection with
each peer proc, whichever of the two dialled it, for frames both ways (so
each sender→receiver pair is FIFO, and a peer's EOF comes after everything
it sent), and routes each incoming frame by its kind (the table and the
headers are in ``danaus._wire.protocol``)::

    CALL   -> a local mailbox (an actor)
    REPLY  -> a local port
    HELLO  -> names the proc that dialled us; we answer WELCOME and use the
              connection both ways, or REFUSED if it speaks another protocol
              version (when both dialled at once, see ``_on_hello``)
    WELCOME-> the proc we dialled took the connection: frames may go on it
    READY  -> a proc we are waiting for is up (or failed to boot)
    LOST   -> the host agent saw a proc exit
    other  -> the one handler a higher layer registered for the kind
              (``register``; a second registration for a kind is refused)

Backpressure: a thread other than the I/O thread that sends to a peer whose
outbound bytes (queued for a proc still starting, in the connection's
backlog, offloaded and not yet released) exceed ``send_high_water`` blocks
until they fall to ``send_low_water`` or the peer is lost; consumers that
fall behind pause the connections that feed them (``flow.Gate``). That state
is the runtime's part ``rt.backpressure`` (``backpressure.py``); CALL and
REPLY frames reach mailboxes and ports through ``rt.router`` (``routing.py``);
the peer table is the base class ``PeerTable`` (``peers.py``).

Large messages: a frame whose out-of-band buffers add up to 1 MiB or more
draws a snapshot's worth from the process's staging budget (``staging_max``)
before anything is copied; above ``send_snapshot_max``, or when the budget
has no room, its buffers are lent instead (nothing copied) and the sending
thread waits until they have left (``Backpressure.wait_sent``): read by the
receiver (offload's RELEASE), or written to the kernel (the connection's
mark). The I/O thread never waits: it copies, budget or not.

Failure detection: a peer is *lost* when our connection with it hits EOF or
an error, when connecting to it is refused, or when the host agent reports its
exit. Everything waiting on a lost peer is told at once (ports watching it,
frames queued for it); a lost peer never comes back, since proc names are
never reused.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import select
import socket
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ... import _config as config
from ..._errors import SupervisionError
from ..._transport import inproc, tls
from ..._transport.address import choose, connect_socket, host_token, join, listen
from ..._transport.auth import Handshake
from ..._transport.conn import Connection
from ..._transport.state import Transport
from ..._wire import codec, memory
from ..._wire.frame import Frame, encode_frame, encode_pickled
from ..._wire.ids import PortId, ProcId
from ..._wire.protocol import (
    PROTOCOL_VERSION,
    STATUS_ERROR,
    STATUS_EXC,
    STATUS_OK,
    Hello,
    Kind,
    Message,
    Ping,
    Refused,
    Reply,
    Route,
    Welcome,
    decode,
    wire,
)
from . import liveness
from .backpressure import Backpressure
from .metrics import Recent, Tracer
from .offload import Offloader, own
from .peers import PeerTable, _Peer
from .relay import Relay
from .routing import Mailbox, PortHandler, Router
from .tree import TreeRouter

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from _typeshed import ReadableBuffer

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


# A message whose out-of-band buffers add up to at least this much is large: lent or
# copied within the staging budget (``memory.staging``); smaller ones are copied freely
# (each peer's share is bounded by send_high_water).
_LARGE = 1 << 20


def _large(buffers: Sequence[ReadableBuffer]) -> int:
    """The bytes of ``buffers`` if they make a large message, else 0."""
    n = 0
    for b in buffers:
        n += len(b) if type(b) is bytes else memoryview(b).nbytes
    return n if n >= _LARGE else 0


class _Give:
    """Gives ``n`` bytes back to the staging budget, once."""

    __slots__ = ("n",)

    def __init__(self, n: int) -> None:
        self.n = n

    def __call__(self) -> None:
        n, self.n = self.n, 0
        if n:
            memory.staging.give(n)


def _has_large(parts: list[Any]) -> bool:
    """Whether a frame part would take long to copy (``offload.own`` copies it in chunks)."""
    return any(not isinstance(p, bytes) and memoryview(p).nbytes >= memory.SMALL for p in parts)


class Runtime(PeerTable):
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

        Its inputs: ``secret`` (the job secret; :meth:`set_secret` sets one
        later), ``insecure`` (may listen on TCP without a secret;
        :meth:`allow_insecure` later) and ``boot`` (how a spawned proc was
        started; empty in the client). Higher layers never set attributes on a
        runtime: what the runtime calls back (:meth:`set_bounce_handler`,
        :meth:`set_block_hook`) and the running trace (:meth:`set_tracer`) are
        registered through these methods.

        ``transport`` is the transport state to share (that of the runtime whose
        in-process network it joins); by default the runtime makes its own and
        releases it when it closes."""
        self.job_dir = job_dir
        self.inproc = inproc
        self.host = host or host_token()
        self._secret = secret
        self._insecure = insecure  # may listen on TCP without a secret (danaus worker --insecure)
        self._unix = f"inproc:{name}" if inproc else f"unix:{os.path.join(job_dir, name + '.sock')}"
        self.proc_id = ProcId(name, join(self._unix, f"host:{self.host}"))
        self.loop = loop if loop is not None else _new_loop()
        self.thread: threading.Thread | None = None
        self._owns_transport = transport is None
        self.transport = transport if transport is not None else Transport()
        self._network = self.transport.inproc
        self._batching = self.transport.batching
        # A thread of this process starts to wait: held write batches go out now.
        self.flush_held: Callable[[], None] = self._batching.flush_held
        self.handlers: dict[Kind, Handler] = {}
        # Routing to mailboxes and ports (routing.py); the dicts are the router's,
        # named here too since every layer above reads them.
        self.router = Router(self)
        self.mailboxes: dict[tuple[str, int], Mailbox] = self.router.mailboxes
        self.ports: dict[int, PortHandler] = self.router.ports
        self.open_port = self.router.open_port
        self.close_port = self.router.close_port
        self.mailbox_added = self.router.mailbox_added
        self.register(Kind.CALL, self.router.on_call)
        self.register(Kind.REPLY, self.router.on_reply)
        self.register(Kind.HELLO, self._on_hello)
        self.register(Kind.WELCOME, self._on_welcome)
        self.register(Kind.REFUSED, self._on_refused)
        self.register(Kind.READY, self._on_ready)
        self.register(Kind.LOST, self._on_lost_report)
        self.register(Kind.PING, _ignore_frame)
        self.tree = TreeRouter(self)  # CAST and GATHER: messages to many actors (tree.py)
        self.relay = Relay(self)  # a gateway's relaying, or an attached client's (relay.py)
        self._watchers: dict[str, set[int]] = {}
        self._peers: dict[str, _Peer] = {}
        self._dialled: set[Connection] = set()  # connections we dialled, open
        self._accepted: set[Connection] = set()  # connections others dialled, open
        self._spares: dict[str, Connection] = {}  # welcomed while we held their proc lost
        self._aliases: dict[Connection, str] = {}  # dialled by address: the name it answered
        # Guards the peer table (_peers and each _Peer's connections, queue and state),
        # _watchers, _spares, exited and the exit/loss waiters.
        self._lock = threading.RLock()
        self.lost_callbacks: list[Callable[[str, str], None]] = []
        self.offload = Offloader(self)
        self.exited: dict[str, str] = {}  # procs the host agent saw exit -> how
        self._exit_waiters: dict[str, list[Callable[[str], None]]] = {}
        self._lost_waiters: dict[str, list[Callable[[str], None]]] = {}
        self._listener: socket.socket | None = None
        self._tcp_listener: socket.socket | None = None
        self._extra_tcp: dict[str, socket.socket] = {}  # more interfaces, same port
        self._handshaking: dict[Connection, None] = {}  # accepted, not yet authenticated
        self._accept_backoff = 0.0
        self._advertised = ""
        self.tcp_advertise: str | None = None  # the IP peers on other hosts reach us at
        self.closed = False
        # how this proc was started (empty in the client); read it, never assign it
        self.boot: dict[str, Any] = boot if boot is not None else {}
        # _bounce(sender, dest, reason): return an undeliverable message (set_bounce_handler)
        self._bounce: Callable[[ActorId | None, str, str], None] = _log_bounce
        # Observing: endpoint metrics on or off; spans recorded while a trace runs;
        # sections a layer adds to this proc's STATS snapshot (name -> plain data).
        self.metrics: bool = bool(config.get("metrics"))
        # Recent messages, spans and ended actors for danaus.telemetry.query (with metrics).
        self.recent: Recent | None = (
            Recent(config.get("query_ring_size"), config.get("query_messages_per_s"))
            if self.metrics
            else None
        )
        # Read on hot paths, so a plain attribute: read it anywhere, set it with set_tracer().
        self.tracer: Tracer | None = None
        self.observers: dict[str, Callable[[], Any]] = {}
        # Backpressure (backpressure.py): held-back senders, paused connections, waits.
        self.backpressure = Backpressure(self)
        self.notify_room = self.backpressure.notify_room
        self.begin_wait = self.backpressure.begin_wait
        self.end_wait = self.backpressure.end_wait
        self.pause_delivering = self.backpressure.pause_delivering
        self.resume_reading = self.backpressure.resume_reading
        # the heartbeat's judge of each watched connection (liveness.py)
        self._judges: dict[Connection, Any] = {}

    # -- inputs and hooks: set through these methods, never by assignment from outside ---

    @property
    def secret(self) -> bytes | None:
        """The job secret that TCP peers must prove they hold (None: none yet)."""
        return self._secret

    def set_secret(self, secret: bytes) -> None:
        """Use job secret ``secret`` from now on (e.g. ``attach_to_workers(secret=...)``):
        connections made or accepted later authenticate with it."""
        self._secret = secret

    @property
    def insecure(self) -> bool:
        """Whether this runtime may listen on TCP without a secret."""
        return self._insecure

    def allow_insecure(self) -> None:
        """Let this runtime listen on TCP without a secret (``DANAUS_INSECURE=1``)."""
        self._insecure = True

    def set_bounce_handler(self, handler: Callable[[ActorId | None, str, str], None]) -> None:
        """``handler(sender, dest, reason)`` returns undeliverable messages to their
        senders from now on (the actor layer's; until then they are logged)."""
        self._bounce = handler

    def bounce(self, sender: ActorId | None, dest: str, reason: str) -> None:
        """A message from ``sender`` to ``dest`` could not be delivered: return it."""
        self._bounce(sender, dest, reason)

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
        if self.inproc:
            self._network.listen(self.proc_id.name, self.loop, self._on_inproc_accept)
        else:
            self._listener = listen(self._unix)
            self.loop.add_reader(self._listener.fileno(), self._on_accept, self._listener, False)
        if not self.inproc:  # a proc in this process cannot freeze or vanish on its own
            self.loop.call_later(config.get("heartbeat_interval"), self._heartbeat)
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
        if self._tcp_listener is not None:
            return f"tcp://{self._advertised}"
        if self._secret is None and not self._insecure:
            raise RuntimeError(
                f"proc {self.proc_id.name} refuses to listen on TCP ({bind}) without a job "
                "secret: anyone who reaches the port could run code in it. Set DANAUS_SECRET "
                "(e.g. to the output of python -c 'import secrets; print(secrets.token_hex(32))') "
                "or pass secret=..."
            )
        entry = f"tcp://{'[' + bind + ']' if ':' in bind else bind}:{port}"
        lsock = listen(entry)
        tcp_port = lsock.getsockname()[1]
        self._tcp_listener = lsock
        self.tcp_advertise = advertise
        adv = f"[{advertise}]" if ":" in advertise else advertise
        self._advertised = f"{adv}:{tcp_port}"
        self.proc_id = ProcId(
            self.proc_id.name, join(self._unix, f"tcp://{self._advertised}", f"host:{self.host}")
        )

        def add() -> None:
            self.loop.add_reader(lsock.fileno(), self._on_accept, lsock, True)

        if self.thread is not None and not self.on_io_thread():
            self.loop.call_soon_threadsafe(add)
        else:
            add()
        return f"tcp://{self._advertised}"

    def listen_inproc(self) -> None:
        """Also accept in-process connections (``inproc:NAME``), from runtimes of this
        process (a simulated mesh). Changes ``proc_id``: call before the address travels.
        """
        if self.inproc or self._network.is_listening(self.proc_id.name):
            return
        self._network.listen(self.proc_id.name, self.loop, self._on_inproc_accept)
        self.proc_id = ProcId(
            self.proc_id.name, join(f"inproc:{self.proc_id.name}", self.proc_id.addr)
        )

    def listen_tcp_also(self, ip: str) -> None:
        """Also accept TCP connections on interface ``ip``, at the same port (I/O thread safe).

        A client that attached workers on two networks (say loopback and a
        cluster network) is reached back by each on the interface it used to
        reach it; it listens on exactly those, never on every interface.
        Raises ``RuntimeError`` before ``listen_tcp``, ``OSError`` if the port
        is taken on ``ip``.
        """
        if self._tcp_listener is None:
            raise RuntimeError("listen_tcp() first: listen_tcp_also() adds an interface to it")
        bound, port = self._tcp_listener.getsockname()[:2]
        if ip == bound or ip in self._extra_tcp or bound in ("0.0.0.0", "::"):
            return
        entry = f"tcp://{'[' + ip + ']' if ':' in ip else ip}:{port}"
        lsock = listen(entry)
        self._extra_tcp[ip] = lsock

        def add() -> None:
            self.loop.add_reader(lsock.fileno(), self._on_accept, lsock, True)

        if self.thread is not None and not self.on_io_thread():
            self.loop.call_soon_threadsafe(add)
        else:
            add()

    def _heartbeat(self) -> None:
        """Ping quiet connections; drop those whose peer is judged lost.

        Unix connections too: a proc on this host that is stopped (SIGSTOP) or
        deadlocked answers nothing, and its socket never closes. Whether a
        silence means lost is for ``liveness`` to say: the kernel's view of a
        proc on this host, a phi-accrual detector for one on another.
        """
        if self.closed:
            return
        now = self.loop.time()
        interval, timeout = config.get("heartbeat_interval"), config.get("heartbeat_timeout")
        conns = self.all_connections()
        ping = None
        me = self.proc_id.name
        judges = self._judges
        for conn in conns:
            if conn.closed or conn.tcp is None:  # tcp None: in-process, nothing to watch
                continue
            if conn.paused or (conn.peer is not None and conn.peer.name == me):
                judges.pop(conn, None)  # we stopped reading it, or it is us: our silence
            else:
                why = self._judge(conn, now - conn.last_recv, interval, timeout)
                if why is not None:
                    conn.fail_now(why)
                    continue
            if conn.authenticated and now - conn.last_send > interval:
                ping = ping or encode_frame(wire(Ping()))
                try:
                    conn.send(ping)
                except Exception:  # a closing connection: its silence is judged next time
                    who = conn.peer.name if conn.peer is not None else "a peer"
                    log.debug("a heartbeat to %s could not be sent", who, exc_info=True)
        for conn in [c for c in judges if c.closed]:
            del judges[conn]
        self.loop.call_later(interval, self._heartbeat)

    def _judge(
        self, conn: Connection, silence: float, interval: float, timeout: float
    ) -> str | None:
        """Why ``conn``'s peer, silent for ``silence`` s, is lost; ``None`` if it is not."""
        judge = self._judges.get(conn)
        if judge is None:
            if conn.tcp:
                judge = liveness.PhiAccrual(conn.last_recv)
            else:
                pid = liveness.peer_pid(conn.sock)
                judge = liveness.LocalProbe(pid) if pid is not None else _NO_PID
            self._judges[conn] = judge
        if isinstance(judge, liveness.PhiAccrual):
            judge.observe(conn.last_recv)
            if silence <= judge.deadline(interval, timeout) or _unread(conn):
                return None
            n, mean, spread = judge.statistics()
            return (
                f"no heartbeat for {silence:.1f} s: the host is unreachable (partitioned) "
                f"or frozen (its last {n} gaps: mean {mean:.2f} s, spread {spread:.2f} s)"
            )
        if silence <= timeout or _unread(conn):
            if isinstance(judge, liveness.LocalProbe):
                judge.check(0.0, timeout)  # heard from: a later silence is judged afresh
            return None
        if isinstance(judge, liveness.LocalProbe):
            return judge.check(silence, timeout)
        return f"no heartbeat for {timeout:.1f} s: the process is frozen (stopped, or stuck)"

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
        self._network.unlisten(self.proc_id.name)
        if self._listener is not None:
            self.loop.remove_reader(self._listener.fileno())
            self._listener.close()
            try:
                os.unlink(self._unix.partition(":")[2])
            except OSError:
                pass
        for lsock in [self._tcp_listener, *self._extra_tcp.values()]:
            if lsock is not None:
                self.loop.remove_reader(lsock.fileno())
                lsock.close()
        self.relay.close()
        for conn in self.all_connections():
            conn.flush_and_close()
        if self._owns_transport:
            self.transport.close()  # what is held went out in flush_and_close

    def all_connections(self) -> list[Connection]:
        """Every open connection: dialled, accepted, established or not (a snapshot)."""
        return [c for c in [*self._dialled, *self._accepted] if not c.closed]

    def connections(self) -> list[tuple[str, str, Connection]]:
        """``(peer proc name, "out" | "in", connection)`` for every open connection
        whose peer said who it is; "out" when we dialled it. Both directions of
        the traffic with that peer go on it."""
        out = [(c.peer.name, "out", c) for c in list(self._dialled) if c.peer is not None]
        out += [(c.peer.name, "in", c) for c in list(self._accepted) if c.peer is not None]
        return [(name, d, c) for name, d, c in out if not c.closed]

    def flushed(self) -> bool:
        """True once every connection is closed (after ``close()``)."""
        return not self.all_connections()

    # -- accepting and hello ------------------------------------------------

    def _on_accept(
        self, lsock: socket.socket, tcp: bool, on_frame: Callable[..., None] | None = None
    ) -> None:
        """Accept what waits on ``lsock``; ``on_frame``: who reads the frames of these
        connections (default: the runtime; a gateway's relay port: the relay)."""
        for _ in range(256):  # then let the loop serve the others
            try:
                s, _ = lsock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self._pause_accepting(lsock, tcp, e, on_frame)
                    return
                continue  # e.g. ECONNABORTED: that one connection is gone
            self._accept_backoff = 0.0
            if tcp:
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            hs = Handshake(self._secret, "server") if tcp and self._secret is not None else None
            try:
                conn = Connection(
                    s,
                    self.loop,
                    self._dispatch if on_frame is None else on_frame,
                    self._on_conn_closed,
                    on_authenticated=self._on_authenticated,
                    handshake=hs,
                    tls=tls.server_context() if tcp else None,
                    server_side=True,
                    batching=self._batching,
                )
            except Exception:
                log.exception("could not set up an incoming connection")
                s.close()
                continue
            if conn.closed:
                continue  # the peer was gone before we even wrote (e.g. reset at once)
            conn.tcp = tcp
            self._allow_direct(conn)
            self._accepted.add(conn)
            if hs is not None:
                self._handshaking[conn] = None
                if len(self._handshaking) > config.get("max_pending_handshakes"):
                    # Unauthenticated peers hold no more than this many connections: the
                    # oldest goes (a legitimate handshake takes a round trip, not seconds).
                    oldest = next(iter(self._handshaking))
                    oldest.fail_now("too many connections in their handshake")

    def _on_inproc_accept(self, conn: inproc.InprocConnection) -> None:
        if self.closed:
            conn.close()
            return
        conn.bind(self._dispatch, self._on_conn_closed)  # type: ignore[arg-type]
        self._accepted.add(conn)  # type: ignore[arg-type]

    def _on_authenticated(self, conn: Connection) -> None:
        self._handshaking.pop(conn, None)

    def _pause_accepting(
        self, lsock: socket.socket, tcp: bool, e: OSError, on_frame: Callable[..., None] | None
    ) -> None:
        """Out of descriptors: stop accepting for a while instead of spinning on the error."""
        self._accept_backoff = min(
            ACCEPT_BACKOFF_MAX, max(ACCEPT_BACKOFF, 2 * self._accept_backoff)
        )
        log.warning("accept failed (%s): pausing for %.2f s", e, self._accept_backoff)
        self.loop.remove_reader(lsock.fileno())

        def resume() -> None:
            if not self.closed and lsock.fileno() >= 0:
                self.loop.add_reader(lsock.fileno(), self._on_accept, lsock, tcp, on_frame)

        self.loop.call_later(self._accept_backoff, resume)

    def _on_hello(self, conn: Connection, msg: Message) -> None:
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
                f"proc {self.proc_id.name} speaks danaus protocol version {PROTOCOL_VERSION} "
                f"but proc {hello.proc.name} speaks version {hello.version}: run the same "
                "danaus release on every host"
            )
            log.error("refusing a connection: %s", reason)
            conn.send(encode_frame(wire(Refused(reason))))
            conn.flush_and_close()
            self.peer_lost(hello.proc.name, reason)  # whatever waits on it hears why, now
            return
        conn.peer = hello.proc
        name = hello.proc.name
        if name == self.proc_id.name:
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
            elif peer.dialing is not None and self.proc_id.name < name:
                action = "wait"
                peer.waiting = conn
            else:
                action = "adopt"
        self.offload.on_hello(conn, hello.offload)
        if action == "spare":
            self._welcome(conn)
        elif action == "adopt":
            self._adopt(peer, conn)

    def _welcome(self, conn: Connection) -> bool:
        try:
            conn.send(encode_frame(wire(Welcome(self.proc_id, self.offload.hello_extra()))))
            return True
        except Exception:
            return False  # closed meanwhile: its close handler tells whoever waits

    def _adopt(self, peer: _Peer, conn: Connection, welcome: bool = True) -> None:
        """Welcome ``conn``, dialled by ``peer``, and make it our connection to it."""
        with self._lock:
            loser, peer.dialing = peer.dialing, None
            peer.waiting = None
        if loser is not None:
            self._dialled.discard(loser)
            loser.close()  # nothing but HELLO went on it
        if not welcome or self._welcome(conn):
            self._establish(peer, conn)

    def _on_welcome(self, conn: Connection, msg: Message) -> None:
        """The proc we dialled took our connection for both directions."""
        welcome: Welcome = msg.header
        if conn.peer is None or conn not in self._dialled:
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
                    reuse = other.link
        if waiting is not None:
            waiting.close()  # theirs lost to ours: they close it too
        if reuse is not None:
            self._establish(peer, reuse)
            conn.close()
            return
        self._establish(peer, conn)
        if alias is not None:
            self._establish(alias, conn)
        self.offload.on_hello(conn, welcome.offload)

    def _establish(self, peer: _Peer, conn: Connection) -> None:
        """``conn`` is our connection to ``peer``; frames go on it unless it is pending."""
        with self._lock:
            peer.link = conn
        conn.on_drained = self.notify_room
        if not peer.pending:
            self._publish(peer)

    def _publish(self, peer: _Peer) -> None:
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
        self.notify_room()

    def _on_refused(self, conn: Connection, msg: Message) -> None:
        """The peer refused our connection: it is lost, for the reason it gave."""
        reason: str = msg.header.reason
        conn.fail_now(reason)
        if conn.peer is not None:
            self.peer_lost(conn.peer.name, reason)

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

    def _allow_direct(self, conn: Connection) -> None:
        if config.get("direct_read"):
            conn.direct_frame = self.router.direct_frame

    def reader_for(self, proc: ProcId) -> Connection | None:
        """The connection to ``proc`` if a waiting thread may read it directly."""
        peer = self._peers.get(proc.name)
        conn = peer.conn if peer is not None else None
        return conn if getattr(conn, "direct_frame", None) is not None else None

    def _on_conn_closed(self, conn: Connection, exc: BaseException | None) -> None:
        """A connection closed (I/O thread). If it was our connection to a peer, the
        peer is lost: everything it sent us came before this EOF, on this same
        connection, so nothing it sent is still on its way."""
        self._accepted.discard(conn)
        self._dialled.discard(conn)
        self._handshaking.pop(conn, None)
        alias = self._aliases.pop(conn, None)
        proc = conn.peer
        if proc is None:
            self.relay.closed(conn, exc)  # a gateway connection, or one relayed through it
            return
        if self.closed:
            return
        lost: list[str] = []
        failed: list[str] = []
        retry = None
        with self._lock:
            if self._spares.get(proc.name) is conn:
                del self._spares[proc.name]
            for name in [proc.name] if alias is None else [proc.name, alias]:
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
            self._adopt(retry, retry.waiting)
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
        if peer is not None and peer.spawned and not peer.stopping and name not in self.exited:
            # Wait briefly for the host agent's report of how it exited (it usually
            # comes within a millisecond) before declaring it lost on the strength
            # of a closed connection alone.
            grace = config.get("exit_report_grace")
            self.loop.call_later(grace, self.peer_lost, name, reason)
        else:
            self.peer_lost(name, reason)

    # -- sending ------------------------------------------------------------

    def send(
        self,
        proc: ProcId,
        header: tuple[Any, ...],
        body: bytes | memoryview = b"",
        buffers: Sequence[ReadableBuffer] = (),
        on_fail: Callable[[str], None] | None = None,
        pickled: bytes | None = None,
    ) -> None:
        """Send a frame with typed ``header`` (``danaus._wire.protocol``) to ``proc``,
        from any thread. Blocks (never on the I/O thread) only while this process
        holds more than ``send_high_water`` for ``proc``, and for a large message
        until its buffers have left this process's memory (``send_snapshot_max``).

        If it cannot be delivered (the peer is lost, now or while the frame
        waits for the peer to come up), ``on_fail(reason)`` is called, or
        :class:`SupervisionError` raised if there is no ``on_fail``.
        ``pickled``, when given, is the pickle of ``wire(header)`` (a caller
        that caches header bytes); it is used when there are no buffers.
        """
        peer = self._peers.get(proc.name)
        if peer is not None:
            bp = self.backpressure
            held = bp.outbound(peer)
            if held and held > bp.send_high:
                bp.wait_for_room(peer)
        peer = self._peers.get(proc.name)
        if peer is not None and peer.conn is not None and peer.conn.tcp is None:
            try:  # a proc of this process (inproc): the frame is handed over, not encoded
                peer.conn.send_message(wire(header), body, buffers)
                return
            except Exception:  # closed: the slow path below reports it
                log.debug("handing a frame to %s failed", proc.name, exc_info=True)
        if pickled is not None and not buffers:
            parts = encode_pickled(pickled, body)
        elif not buffers:
            parts = encode_frame(wire(header), body)
        else:
            self._send_buffers(proc, header, body, buffers, on_fail)
            return
        if peer is not None and peer.conn is not None and not peer.conn.closed:
            try:
                peer.conn.send(parts)
                return
            except Exception:  # lost: fall through to the slow path, which reports it
                log.debug("sending a frame to %s failed", proc.name, exc_info=True)
        self._send_slow(proc, parts, on_fail, None)

    def outbound_bytes(self, name: str) -> int:
        """Bytes of frames to proc ``name`` this process still holds (queued, in its
        connection's backlog, offloaded and not yet read): a statistic."""
        peer = self._peers.get(name)
        return 0 if peer is None else self.backpressure.outbound(peer)

    def _send_buffers(
        self,
        proc: ProcId,
        header: tuple[Any, ...],
        body: bytes | memoryview,
        buffers: Sequence[ReadableBuffer],
        on_fail: Callable[[str], None] | None,
    ) -> None:
        """``send`` of a frame with out-of-band buffers: those of a large message are
        lent (no copy; this thread waits until they have left) or copied within the
        ``staging_max`` budget (see ``send_snapshot_max``)."""
        raw = wire(header)
        large = _large(buffers)
        on_left: Callable[[], None] | None = None
        sent: threading.Event | None = None
        if large:
            if not self.on_io_thread() and (
                large > config.get("send_snapshot_max") or not memory.staging.try_take(large)
            ):
                sent = threading.Event()
                on_left = sent.set
            else:
                if self.on_io_thread():  # never waits: copies, within the budget or not
                    memory.staging.take(large)
                on_left = _Give(large)
        offloaded = False
        if self.offload.ok_peers:
            raw, buffers, offloaded = self.offload.wrap(
                proc.name, raw, buffers, on_left, lend=sent is not None
            )
        parts = encode_frame(raw, body, buffers)
        conn_left = None if offloaded else on_left
        try:
            peer = self._peers.get(proc.name)
            if peer is not None and peer.conn is not None and not peer.conn.closed:
                try:
                    # Lent: the caller waits; else what is not written at once is a
                    # snapshot, its budget given back once it is written.
                    peer.conn.send(parts, conn_left, copy=sent is None)
                    return
                except Exception:  # lost: fall through to the slow path, which reports it
                    log.debug("sending a frame to %s failed", proc.name, exc_info=True)
            self._send_slow(proc, parts, on_fail, conn_left, lend=sent is not None)
        finally:
            if sent is not None:
                self.backpressure.wait_sent(proc.name, sent)

    def _send_slow(
        self,
        proc: ProcId,
        parts: list[Any],
        on_fail: Callable[[str], None] | None,
        on_left: Callable[[], None] | None,
        *,
        lend: bool = False,
    ) -> None:
        """``send`` to a peer not connected yet (queued), lost, or whose connection
        broke. ``on_left`` as for ``Connection.send``; with ``lend`` the parts are
        queued as they are (the caller waits for ``on_left``), else copied."""
        # Sent later, if the peer is not connected yet: keep a snapshot (the caller may
        # change its arrays now). A large one is made outside the lock, which the I/O
        # thread takes, and the peer looked at again after.
        owned: list[Any] | None = parts if lend else None
        while True:
            with self._lock:
                peer = self._peers.get(proc.name)
                if peer is None:
                    peer = self._peers[proc.name] = _Peer(proc, pending=False)
                later = peer.lost is None and (peer.pending or peer.conn is None)
                if later and (owned is not None or not _has_large(parts)):
                    if owned is None:
                        owned = [p if isinstance(p, bytes) else own(p) for p in parts]
                    # A snapshot keeps its budget until it is written (on_left, which
                    # the connection calls, as it does for a lent frame).
                    peer.queue.append((owned, on_fail, on_left))
                    peer.queued_bytes += sum(len(p) for p in owned)
                    if not peer.pending and len(peer.queue) == 1:
                        self.call_soon(self._connect, peer)
                    return
                lost = peer.lost
            if not later:
                break
            owned = [p if isinstance(p, bytes) else own(p) for p in parts]
        if lost is None:
            assert peer.conn is not None
            try:
                peer.conn.send(parts, on_left, copy=not lend)
                return
            except Exception as e:
                lost = f"sending to proc {proc.name} failed: {e}"
        if on_left is not None:
            on_left()
        if on_fail is not None:
            on_fail(lost)
        else:
            raise SupervisionError(f"proc {proc.name} is unreachable: {lost}", reason=lost)

    def _connect(self, peer: _Peer) -> None:
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
            entry = choose(peer.proc.addr, self.host, self._network)
            if entry.startswith("inproc:"):
                self._connect_inproc(peer, entry[len("inproc:") :])
                return
            if self.relay.via is not None and not entry.startswith("unix:"):
                self.relay.dial(peer)  # an attached client reaches other hosts through it
                return
            route = entry.startswith("via:")  # a peer reached through a gateway's relay port
            conn = self.dial(entry[len("via:") :] if route else entry, self._dispatch)
        except Exception as e:  # refused, no route, bad TLS files ...: never strand the queue
            self.peer_lost(peer.proc.name, f"cannot connect to proc {peer.proc.name}: {e}")
            return
        self._allow_direct(conn)
        if route:
            try:  # before HELLO: whom the gateway is to relay this connection to
                conn.send(encode_frame(wire(Route(peer.proc))))
            except Exception:  # closed at once: the HELLO below reports it
                log.debug("a ROUTE to %s could not be sent", peer.proc.name, exc_info=True)
        self._dialing(peer, conn, self.offload.hello_extra())

    def dial(self, entry: str, on_frame: Callable[[Connection, Frame], None]) -> Connection:
        """A connection to address entry ``entry`` (``unix:`` or ``tcp://``; I/O thread)
        whose frames go to ``on_frame``; authenticated with the job secret over TCP.
        Raises ``OSError`` (refused, no route) or what TLS set-up raises."""
        s = connect_socket(entry)
        tcp = entry.startswith("tcp://")
        hs = Handshake(self._secret, "client") if tcp and self._secret is not None else None
        try:
            conn = Connection(
                s,
                self.loop,
                on_frame,
                self._on_conn_closed,
                handshake=hs,
                tls=tls.client_context() if tcp else None,
                batching=self._batching,
            )
        except BaseException:
            s.close()
            raise
        conn.tcp = tcp
        self._dialled.add(conn)
        return conn

    # -- relaying (relay.py) ------------------------------------------------------

    def advertise_via(self, entry: str) -> None:
        """Be reached through a gateway's relay port (``via:tcp://...``) instead of TCP:
        an attached client, and the procs it spawns on its host. Call before the
        address travels (it changes ``proc_id``)."""
        self.proc_id = ProcId(self.proc_id.name, join(self._unix, entry, f"host:{self.host}"))

    def accept_relayed(self, conn: Any) -> None:
        """A relayed connection a proc dialled to us through the gateway (I/O thread)."""
        conn.bind(self._dispatch, self._on_conn_closed)
        self._accepted.add(conn)

    def open_relay_port(
        self, on_frame: Callable[[Connection, Frame], None]
    ) -> tuple[socket.socket, str]:
        """Listen on another TCP port of the interface of ``listen_tcp`` whose
        connections' frames go to ``on_frame`` (a gateway's relay port; I/O thread).
        Returns the socket and its advertised ``tcp://`` address."""
        if self._tcp_listener is None or self.tcp_advertise is None:
            raise OSError("this proc does not listen on TCP")
        bound = self._tcp_listener.getsockname()[0]
        lsock = listen(f"tcp://{'[' + bound + ']' if ':' in bound else bound}:0")
        self.loop.add_reader(lsock.fileno(), self._on_accept, lsock, True, on_frame)
        adv = self.tcp_advertise
        return lsock, f"tcp://{'[' + adv + ']' if ':' in adv else adv}:{lsock.getsockname()[1]}"

    def close_relay_port(self, lsock: socket.socket) -> None:
        """Stop listening on a relay port (I/O thread); its connections stay."""
        if lsock.fileno() >= 0:
            self.loop.remove_reader(lsock.fileno())
            lsock.close()

    def _connect_inproc(self, peer: _Peer, name: str) -> None:
        conn: Any = self._network.connect(
            name,
            self.loop,
            self._dispatch,  # type: ignore[arg-type]
            self._on_conn_closed,  # type: ignore[arg-type]
        )
        self._dialing(peer, conn, ())

    def _dialing(self, peer: _Peer, conn: Connection, offload: tuple[Any, ...]) -> None:
        conn.peer = peer.proc
        self._dialled.add(conn)
        with self._lock:
            peer.dialing = conn
        try:
            conn.send(encode_frame(wire(Hello(self.proc_id, PROTOCOL_VERSION, offload))))
        except Exception as e:  # it closed at once (before its close could name the peer)
            self._on_conn_closed(conn, conn.close_exc or e)

    # -- ports ----------------------------------------------------------------

    def unwatch(self, procs: Iterable[str], port: int) -> None:
        """Stop telling ``port`` about the loss of ``procs`` (names)."""
        with self._lock:
            for name in procs:
                ports = self._watchers.get(name)
                if ports is not None:
                    ports.discard(port)
                    if not ports:
                        del self._watchers[name]

    def watch(self, proc: ProcId, port: int) -> str | None:
        """Tell port ``port`` if ``proc`` is lost. Returns the reason if it already is."""
        with self._lock:
            peer = self._peers.get(proc.name)
            if peer is None:
                peer = self._peers[proc.name] = _Peer(proc, pending=False)
            if peer.lost is not None:
                return peer.lost
            self._watchers.setdefault(proc.name, set()).add(port)
            return None

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
            local = getattr(self.ports.get(port.port), "local_reply", None)
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


_NO_PID = object()  # a Unix peer whose pid the kernel did not give: the plain timeout


def _unread(conn: Connection) -> bool:
    """True if bytes wait in ``conn``'s socket: the peer spoke, we did not listen (our
    loop was held up, e.g. by a long callback), so it is no silent peer."""
    try:
        return bool(select.select([conn.fd], [], [], 0)[0])
    except (OSError, ValueError):
        return False


def _ignore(reason: str) -> None:
    pass


def _ignore_frame(conn: Connection, msg: Message) -> None:
    pass


def _log_bounce(sender: ActorId | None, dest: str, reason: str) -> None:
    log.error("a message from %s to %s could not be delivered: %s", sender, dest, reason)
