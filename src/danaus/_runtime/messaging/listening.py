"""The listeners of a runtime: where other procs reach it, and accepting them.

A part of `Runtime` (``rt.listeners``).
It listens on the proc's Unix socket (or its ``inproc:NAME`` in a simulated
mesh), on TCP when asked (every TCP connection authenticates with the job
secret), on more interfaces at the same port, and on a gateway's relay port;
it accepts what comes and hands each new connection to ``accepted``. Out of
file descriptors, it stops accepting for a while (doubling up to a second)
instead of spinning on the error. Its methods run on the I/O thread, except
``listen_tcp``/``listen_tcp_also`` (any thread, before the address travels).
"""

from __future__ import annotations

import errno
import logging
import os
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ... import _config as config
from ..._transport import inproc, tls
from ..._transport.address import listen
from ..._transport.auth import Handshake
from ..._transport.conn import Connection

if TYPE_CHECKING:
    import asyncio

    from ..._transport.conn import Batching
    from ..._wire.frame import Frame

__all__ = ["Listeners"]

log = logging.getLogger("danaus.runtime")

# out of file descriptors, stop accepting for this long (doubling up to the max).
ACCEPT_BACKOFF, ACCEPT_BACKOFF_MAX = 0.01, 1.0


def _bracket(ip: str) -> str:
    return f"[{ip}]" if ":" in ip else ip


class Listeners:
    """Where this proc listens, and the accepting of connections (see the module).

    ``name``: the proc's name; ``unix``: its Unix (or ``inproc:``) address entry;
    ``secret``/``insecure``: the job secret and whether it may listen on TCP
    without one (the runtime's ``set_secret()``/``allow_insecure()`` change
    them); ``accepted(conn)``: a new connection to keep (the runtime's links);
    ``dispatch``/``on_closed``: where a connection's frames and its close go;
    ``call_on_loop(fn)``: run ``fn`` on the I/O thread; ``closed()``: the
    runtime has closed.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        name: str,
        unix: str,
        network: inproc.Network,
        batching: Batching,
        *,
        secret: bytes | None,
        insecure: bool,
        accepted: Callable[[Connection], None],
        dispatch: Callable[[Connection, Frame], None],
        on_closed: Callable[[Connection, BaseException | None], None],
        call_on_loop: Callable[[Callable[[], None]], None],
        closed: Callable[[], bool],
    ) -> None:
        self.loop = loop
        self.name = name
        self.unix = unix
        self._network = network
        self._batching = batching
        # The job secret TCP peers must prove they hold (None: none yet; the runtime's
        # set_secret() changes it), and whether TCP without one is allowed.
        self.secret = secret
        self.insecure = insecure
        self._accepted = accepted
        self._dispatch = dispatch
        self._on_closed = on_closed
        self._call_on_loop = call_on_loop
        self._closed = closed
        self._listener: socket.socket | None = None
        self._tcp: socket.socket | None = None
        self._extra_tcp: dict[str, socket.socket] = {}  # more interfaces, same port
        self.handshaking: dict[Connection, None] = {}  # accepted, not yet authenticated
        self._backoff = 0.0
        self.advertised = ""  # host:port of the TCP listener, as peers reach it
        self.tcp_advertise: str | None = None  # the IP peers on other hosts reach us at

    @property
    def tcp_bind(self) -> str | None:
        """The IP the TCP listener is bound to (None: not listening on TCP)."""
        return None if self._tcp is None else str(self._tcp.getsockname()[0])

    def listen(self, in_process: bool) -> None:
        """Listen on the proc's own address: ``inproc:NAME``, or its Unix socket."""
        if in_process:
            self._network.listen(self.name, self.loop, self._on_inproc_accept)
        else:
            self._listener = listen(self.unix)
            self.loop.add_reader(self._listener.fileno(), self.on_accept, self._listener, False)

    def listen_inproc(self) -> bool:
        """Also accept in-process connections; False if it does already."""
        if self._network.is_listening(self.name):
            return False
        self._network.listen(self.name, self.loop, self._on_inproc_accept)
        return True

    def listen_tcp(self, bind: str, advertise: str, port: int = 0) -> tuple[str, bool]:
        """Also accept TCP connections on ``bind:port``; returns the advertised
        ``tcp://`` entry and whether it is new. ``RuntimeError`` without a secret
        (unless insecure)."""
        if self._tcp is not None:
            return f"tcp://{self.advertised}", False
        if self.secret is None and not self.insecure:
            raise RuntimeError(
                f"proc {self.name} refuses to listen on TCP ({bind}) without a job "
                "secret: anyone who reaches the port could run code in it. Set DANAUS_SECRET "
                "(e.g. to the output of python -c 'import secrets; print(secrets.token_hex(32))') "
                "or pass secret=..."
            )
        lsock = listen(f"tcp://{_bracket(bind)}:{port}")
        self._tcp = lsock
        self.tcp_advertise = advertise
        self.advertised = f"{_bracket(advertise)}:{lsock.getsockname()[1]}"
        self._call_on_loop(lambda: self._watch(lsock))
        return f"tcp://{self.advertised}", True

    def listen_tcp_also(self, ip: str) -> None:
        """Also accept TCP connections on interface ``ip``, at the same port.
        ``RuntimeError`` before ``listen_tcp``, ``OSError`` if the port is taken."""
        if self._tcp is None:
            raise RuntimeError("listen_tcp() first: listen_tcp_also() adds an interface to it")
        bound, port = self._tcp.getsockname()[:2]
        if ip == bound or ip in self._extra_tcp or bound in ("0.0.0.0", "::"):
            return
        lsock = listen(f"tcp://{_bracket(ip)}:{port}")
        self._extra_tcp[ip] = lsock
        self._call_on_loop(lambda: self._watch(lsock))

    def _watch(self, lsock: socket.socket) -> None:
        self.loop.add_reader(lsock.fileno(), self.on_accept, lsock, True)

    def open_relay_port(
        self, on_frame: Callable[[Connection, Frame], None]
    ) -> tuple[socket.socket, str]:
        """Listen on another TCP port of the interface of ``listen_tcp`` whose
        connections' frames go to ``on_frame`` (a gateway's relay port; I/O thread).
        Returns the socket and its advertised ``tcp://`` address."""
        bound = self.tcp_bind
        if bound is None or self.tcp_advertise is None:
            raise OSError("this proc does not listen on TCP")
        lsock = listen(f"tcp://{_bracket(bound)}:0")
        self.loop.add_reader(lsock.fileno(), self.on_accept, lsock, True, on_frame)
        return lsock, f"tcp://{_bracket(self.tcp_advertise)}:{lsock.getsockname()[1]}"

    def close_relay_port(self, lsock: socket.socket) -> None:
        """Stop listening on a relay port (I/O thread); its connections stay."""
        if lsock.fileno() >= 0:
            self.loop.remove_reader(lsock.fileno())
            lsock.close()

    def close(self) -> None:
        """Stop listening everywhere (I/O thread); remove the Unix socket's file."""
        self._network.unlisten(self.name)
        if self._listener is not None:
            self.loop.remove_reader(self._listener.fileno())
            self._listener.close()
            try:
                os.unlink(self.unix.partition(":")[2])
            except OSError:
                pass
        for lsock in [self._tcp, *self._extra_tcp.values()]:
            if lsock is not None:
                self.loop.remove_reader(lsock.fileno())
                lsock.close()

    # -- accepting ------------------------------------------------------------------

    def on_accept(
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
                    self._pause(lsock, tcp, e, on_frame)
                    return
                continue  # e.g. ECONNABORTED: that one connection is gone
            self._backoff = 0.0
            if tcp:
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            secret = self.secret
            hs = Handshake(secret, "server") if tcp and secret is not None else None
            try:
                conn = Connection(
                    s,
                    self.loop,
                    self._dispatch if on_frame is None else on_frame,
                    self._on_closed,
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
            self._accepted(conn)
            if hs is not None:
                self.handshaking[conn] = None
                if len(self.handshaking) > config.get("max_pending_handshakes"):
                    # Unauthenticated peers hold no more than this many connections: the
                    # oldest goes (a legitimate handshake takes a round trip, not seconds).
                    oldest = next(iter(self.handshaking))
                    oldest.fail_now("too many connections in their handshake")

    def _on_inproc_accept(self, conn: inproc.InprocConnection) -> None:
        if self._closed():
            conn.close()
            return
        conn.bind(self._dispatch, self._on_closed)  # type: ignore[arg-type]
        self._accepted(conn)  # type: ignore[arg-type]

    def _on_authenticated(self, conn: Connection) -> None:
        self.handshaking.pop(conn, None)

    def _pause(
        self, lsock: socket.socket, tcp: bool, e: OSError, on_frame: Callable[..., Any] | None
    ) -> None:
        """Out of descriptors: stop accepting for a while instead of spinning on the error."""
        self._backoff = min(ACCEPT_BACKOFF_MAX, max(ACCEPT_BACKOFF, 2 * self._backoff))
        log.warning("accept failed (%s): pausing for %.2f s", e, self._backoff)
        self.loop.remove_reader(lsock.fileno())

        def resume() -> None:
            if not self._closed() and lsock.fileno() >= 0:
                self.loop.add_reader(lsock.fileno(), self.on_accept, lsock, tcp, on_frame)

        self.loop.call_later(self._backoff, resume)
