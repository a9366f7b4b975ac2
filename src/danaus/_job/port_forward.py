"""``PortForwarder``: point-to-point TCP forwards between two proc meshes, as Monarch's.

For every point of the source mesh, its proc listens on ``src_address`` and each
connection accepted there is relayed to ``127.0.0.1:dst_port`` on the
destination proc at the same point. The bytes travel in ordinary actor
messages (authenticated like all of the mesh's traffic): source to destination
as ``data``/``eof`` messages in order, back on a ``Port`` per connection, which
also carries the destination's acks of what it wrote: a source reads its client
only while less than a window of bytes is unwritten (flow control, so a service
that reads slowly holds the client back rather than filling memory). A reset on
either side is passed on as a reset (a clean close would leave a peer that is
blocked writing into a full window waiting), and stopping resets what is open. Source procs
may share one address (``SO_REUSEPORT``).
Stopping the ``PortForwarder`` stops every forward it started (listeners closed,
connections cut).

Who may connect (issue 40, N3): the listening port is not the mesh's, so the
transport's authentication does not cover it. A source accepts a connection
only from a process of its own user: on Linux the kernel says which user owns
the other end of a connection from this host (``/proc/net/tcp`` and ``tcp6``,
the socket whose local address is the peer's and whose remote address is ours),
and a connection of another user is reset at once. A connection from another
host (no such socket here) is reset too unless the ``port_forward_allow_remote``
setting is on. ``src_address`` ``unix:PATH`` listens on a Unix socket of mode
0600 instead (and checks ``SO_PEERCRED``). Each source relays at most
``port_forward_max_connections`` connections at once and resets one on which no
byte moved for ``port_forward_idle_timeout``.

Both ends run on an asyncio loop of their own (one thread per source or
destination actor, whatever the number of connections), not on threads per
connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import stat
import struct
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, NamedTuple, TypeVar

from .. import _config as config
from .._actor.api.actor import Actor
from .._actor.api.endpoint import endpoint
from .._actor.core.context import current_rank
from .._actor.core.ports import Channel, Port

__all__ = ["PortForwarder", "peer_uid"]

log = logging.getLogger("danaus.port_forward")

T = TypeVar("T")

_HOST = "127.0.0.1"
_READ = 64 * 1024
_UNIX = "unix:"


def _check_port(name: str, port: Any) -> int:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"{name} must be an integer from 1 through 65535, got {port!r}")
    return port


def _parse_address(address: Any) -> tuple[str, int]:
    """``"host:port"`` -> (host, port); ``"unix:PATH"`` -> (PATH, 0)."""
    if isinstance(address, str) and address.startswith(_UNIX):
        path = address[len(_UNIX) :]
        if not path:
            raise ValueError(f"src_address 'unix:PATH' needs a path, got {address!r}")
        return path, 0
    if not isinstance(address, str):
        raise ValueError(f"src_address must be 'address:port' or 'unix:PATH', got {address!r}")
    host, sep, port = address.rpartition(":")
    if not sep or not host:
        raise ValueError(f"src_address must be 'address:port' or 'unix:PATH', got {address!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not port.isdigit():
        raise ValueError(f"src_address's port must be an integer, got {address!r}")
    return host, _check_port("src_address's port", int(port))


def _at_point(value: Any) -> Any:
    return value(current_rank()) if callable(value) else value


# -- who is at the other end ------------------------------------------------------------


def _packed(addr: str) -> bytes:
    """An IP address as 16 bytes (IPv4 as IPv4-mapped IPv6)."""
    addr = addr.split("%", 1)[0]
    if ":" in addr:
        return socket.inet_pton(socket.AF_INET6, addr)
    return b"\0" * 10 + b"\xff\xff" + socket.inet_pton(socket.AF_INET, addr)


def _proc_addr(text: str) -> tuple[bytes, int]:
    """An ``ADDR:PORT`` of ``/proc/net/tcp{,6}`` (32-bit words in host order) unpacked."""
    hexaddr, hexport = text.split(":")
    raw = bytes.fromhex(hexaddr)
    words = b"".join(struct.pack("=I", w) for w in struct.unpack(f">{len(raw) // 4}I", raw))
    if len(words) == 4:
        words = b"\0" * 10 + b"\xff\xff" + words
    return words, int(hexport, 16)


def peer_uid(local: tuple[Any, ...], remote: tuple[Any, ...]) -> int | None:
    """The uid owning the other end of this host's TCP connection from ``remote`` to
    ``local`` (our socket's ``getsockname()``, ``getpeername()``), or None when no socket
    of this host is that end (the peer is on another host, or already gone).

    Reads ``/proc/net/tcp`` and ``/proc/net/tcp6``: the peer's socket is the one whose
    local address is our remote one and whose remote address is our local one.
    """
    want_local = (_packed(str(remote[0])), int(remote[1]))
    want_remote = (_packed(str(local[0])), int(local[1]))
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                lines = f.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 8:
                continue
            if _proc_addr(fields[1]) == want_local and _proc_addr(fields[2]) == want_remote:
                return int(fields[7])
    return None


def _who(sock: socket.socket) -> tuple[int | None, str]:
    """(uid of the peer, or None if it is on another host; how it was learnt)."""
    if sock.family == socket.AF_UNIX:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        return struct.unpack("3i", creds)[1], "SO_PEERCRED"
    return peer_uid(sock.getsockname(), sock.getpeername()), "/proc/net/tcp"


# -- the loop both ends run on ----------------------------------------------------------


class _Loop:
    """An asyncio loop on a thread of its own, for one source or destination actor."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop; block until it is done (never from the loop)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def call(self, fn: Callable[..., Any], *args: Any) -> None:
        with contextlib.suppress(RuntimeError):  # closed: nothing is forwarded any more
            self.loop.call_soon_threadsafe(fn, *args)

    def close(self) -> None:
        """Stop the loop after what it runs now; its thread ends."""
        self.call(self.loop.stop)
        if threading.current_thread() is not self.thread:
            self.thread.join(timeout=10)


def _cut(writer: asyncio.StreamWriter, reset: bool) -> None:
    """End a forwarded connection now; with ``reset`` the peer gets a reset, not a clean
    close, so it fails at once even when it is blocked writing into a full window (a
    clean close would leave it waiting on a closed window until the kernel gives up)."""
    sock = writer.get_extra_info("socket")
    if reset and sock is not None and sock.family != socket.AF_UNIX:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


# Bytes a source may have sent on one connection that its destination has not yet
# written to the service: past this the source stops reading its client until acks come.
_WINDOW = 4 * 1024 * 1024
_EOF = b""  # on a destination's queue: shut the service's side for writing


class _Out:
    """One forwarded connection at its destination: the service's connection, a writer
    task that writes the data messages to it in order and acks each chunk written,
    and a pump task that sends what the service answers back."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, back: Port[Any]
    ) -> None:
        self.writer = writer
        self.back = back
        self.queue: asyncio.Queue[bytes] = asyncio.Queue()
        self.tasks = [
            asyncio.ensure_future(self._write()),
            asyncio.ensure_future(self._pump(reader)),
        ]

    async def _write(self) -> None:
        while True:
            data = await self.queue.get()
            try:
                if not data:  # _EOF
                    self.writer.write_eof()
                else:
                    self.writer.write(data)
                    await self.writer.drain()
                    self.back.send(("ack", len(data)))
            except OSError:
                self.close(reset=True)  # the service went away: the pump tells the source
                return

    async def _pump(self, reader: asyncio.StreamReader) -> None:
        try:
            while data := await reader.read(_READ):
                self.back.send(("data", data))
            self.back.send(("eof", b""))
        except OSError:
            self.back.send(("abort", b""))

    def close(self, reset: bool) -> None:
        """End the connection at once; with ``reset``, as a reset the service sees."""
        for task in self.tasks:
            if task is not asyncio.current_task():
                task.cancel()
        _cut(self.writer, reset)


class _Destination(Actor):
    """Connects to the destination service for each forwarded connection.

    Its endpoints never wait on the service: data goes to the connection's writer
    task, which acks what it has written, so the source holds back (a window of
    ``_WINDOW`` bytes) instead of this actor, and ``close`` or a stop cuts a
    connection whose service does not read at once.
    """

    def __init__(self) -> None:
        self._port: int | None = None
        self._conns: dict[str, _Out] = {}  # touched on the loop only
        self._loop = _Loop("danaus-forward-destination")

    @endpoint
    def configure(self, dst_port: Any) -> None:
        self._port = _check_port("dst_port", _at_point(dst_port))

    @endpoint
    def open(self, conn: str, back: Port[tuple[str, Any]]) -> None:
        if self._port is None:
            raise RuntimeError("port forward destination is not configured")
        self._loop.run(self._open(conn, back, self._port))

    async def _open(self, conn: str, back: Port[Any], port: int) -> None:
        reader, writer = await asyncio.open_connection(_HOST, port)
        self._conns[conn] = _Out(reader, writer, back)

    def _put(self, conn: str, data: bytes) -> None:
        out = self._conns.get(conn)
        if out is not None:
            out.queue.put_nowait(data)

    @endpoint
    def data(self, conn: str, data: bytes) -> None:
        if data:
            self._loop.call(self._put, conn, data)

    @endpoint
    def eof(self, conn: str) -> None:
        self._loop.call(self._put, conn, _EOF)

    def _close(self, conn: str, reset: bool) -> None:
        out = self._conns.pop(conn, None)
        if out is not None:
            out.close(reset)

    @endpoint
    def close(self, conn: str, reset: bool = False) -> None:
        """End connection ``conn``: cleanly once both sides are done, with a reset when
        its client reset it or went away."""
        self._loop.call(self._close, conn, reset)

    def _close_all(self) -> None:
        for conn in list(self._conns):
            self._close(conn, reset=True)  # stopping cuts the connections

    def __cleanup__(self, exc: Any) -> None:
        self._loop.call(self._close_all)
        self._loop.close()


class _Limits(NamedTuple):
    """Who may connect to a source and how many: the forwarder's settings, read where
    ``forward`` is called (a source proc may have been started with other ones)."""

    allow_remote: bool
    max_connections: int
    idle_timeout: float  # 0: never

    @classmethod
    def from_settings(cls) -> _Limits:
        return cls(
            config.get("port_forward_allow_remote"),
            config.get("port_forward_max_connections"),
            config.get("port_forward_idle_timeout"),
        )


class _Relay:
    """One connection at its source: the client's streams and the flow control state."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.unacked = 0  # bytes sent, not yet written by the destination
        self.over = False  # the way back has ended
        self.window = asyncio.Condition()
        self.active = time.monotonic()  # when a byte last moved either way


class _Source(Actor):
    """Listens at the source address and relays each connection to its destination."""

    def __init__(self) -> None:
        self._server: asyncio.AbstractServer | None = None
        self._expiry: asyncio.Future[None] | None = None
        self._dest: Any = None
        self._conns: dict[str, _Relay] = {}  # touched on the loop only
        self._limits = _Limits(False, 0, 0.0)
        self._uid = os.getuid()
        self._loop = _Loop("danaus-forward-source")

    @endpoint
    def start(self, destination: Any, src_address: Any, limits: _Limits) -> None:
        self._dest = destination.slice(**dict(current_rank()))
        self._limits = limits
        host, port = _parse_address(_at_point(src_address))
        if port == 0:
            server = _unix_listener(host)
        else:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            server = socket.socket(family, socket.SOCK_STREAM)
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if hasattr(socket, "SO_REUSEPORT"):  # several source procs may share one address
                server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            try:
                server.bind((host, port))
                server.listen()
            except OSError:
                server.close()
                raise
        self._loop.run(self._listen(server))

    async def _listen(self, server: socket.socket) -> None:
        self._server = await asyncio.start_server(self._accepted, sock=server)
        idle = self._limits.idle_timeout
        if idle > 0:
            self._expiry = asyncio.ensure_future(self._expire(idle))

    async def _expire(self, idle: float) -> None:
        """Reset connections on which nothing moved for ``idle`` seconds."""
        while True:
            await asyncio.sleep(min(idle / 4, 30.0))
            now = time.monotonic()
            for conn, relay in list(self._conns.items()):
                if now - relay.active >= idle:
                    log.info("port forward: resetting a connection idle for %.0f s", idle)
                    self._dest.close.broadcast(conn, True)
                    self._end(conn, reset=True)

    def _admit(self, writer: asyncio.StreamWriter) -> bool:
        sock = writer.get_extra_info("socket")
        try:
            uid, how = _who(sock)
        except OSError:  # gone already
            return False
        if uid is None:
            if not self._limits.allow_remote:
                log.warning(
                    "port forward: refused a connection from %s on another host: set "
                    "port_forward_allow_remote to let other hosts in",
                    writer.get_extra_info("peername"),
                )
                return False
        elif uid != self._uid:
            log.warning(
                "port forward: refused a connection from uid %d (%s); only uid %d may connect",
                uid,
                how,
                self._uid,
            )
            return False
        cap = self._limits.max_connections
        if len(self._conns) >= cap:
            log.warning(
                "port forward: refused a connection: port_forward_max_connections (%d) are "
                "open; close one or raise DANAUS_PORT_FORWARD_MAX_CONNECTIONS",
                cap,
            )
            return False
        return True

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self._admit(writer):
            _cut(writer, reset=True)
            return
        conn = secrets.token_hex(8)
        relay = _Relay(writer)
        self._conns[conn] = relay
        back, receiver = Channel[tuple[str, Any]].open()
        dest = self._dest
        receiver._watch(dest._ref.procs[dest._shape.ranks()[0]])  # a lost destination ends it
        try:
            await dest.open.call_one(conn, back)
        except Exception:  # the service refused or the destination is gone: reset the client
            self._end(conn, reset=True)
            receiver.close()
            return
        backward = asyncio.ensure_future(self._backward(conn, relay, receiver))
        try:
            while data := await reader.read(_READ):
                relay.active = time.monotonic()
                async with relay.window:  # hold back while the destination's service is behind
                    await relay.window.wait_for(lambda: relay.unacked < _WINDOW or relay.over)
                    if relay.over:
                        break
                    relay.unacked += len(data)
                dest.data.broadcast(conn, data)
            else:
                dest.eof.broadcast(conn)
        except OSError:  # the client reset the connection: reset the service's side now
            dest.close.broadcast(conn, True)
            self._end(conn, reset=True)
        await backward
        dest.close.broadcast(conn)
        receiver.close()
        self._end(conn)

    async def _backward(self, conn: str, relay: _Relay, receiver: Any) -> None:
        writer = relay.writer
        while True:
            try:
                kind, data = await receiver.recv()
            except Exception:
                kind, data = "abort", b""
            relay.active = time.monotonic()
            if kind == "ack":
                async with relay.window:
                    relay.unacked -= data
                    relay.window.notify_all()
                continue
            if kind == "data":
                try:
                    writer.write(data)
                    await writer.drain()
                except OSError:  # the client went away: reset the service's side
                    self._dest.close.broadcast(conn, True)
                    self._end(conn, reset=True)
                continue
            if kind == "eof":
                with contextlib.suppress(OSError, RuntimeError):
                    if writer.can_write_eof() and not writer.transport.is_closing():
                        writer.write_eof()
            else:  # the service reset or the destination was lost: reset the client
                self._end(conn, reset=True)
            async with relay.window:
                relay.over = True
                relay.window.notify_all()
            return

    def _end(self, conn: str, reset: bool = False) -> None:
        relay = self._conns.pop(conn, None)
        if relay is None:
            return  # ended already
        if reset:
            _cut(relay.writer, reset=True)
        else:
            relay.writer.close()

    def _close_all(self) -> None:
        if self._server is not None:
            self._server.close()
        if self._expiry is not None:
            self._expiry.cancel()
        for conn in list(self._conns):
            self._end(conn, reset=True)  # stopping cuts the connections

    def __cleanup__(self, exc: Any) -> None:
        self._loop.call(self._close_all)
        self._loop.close()


def _unix_listener(path: str) -> socket.socket:
    """A Unix socket listening at ``path`` with mode 0600: made so before it listens,
    so nobody connects while it has the umask's mode (a connect before ``listen``
    is refused)."""
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)  # a stale socket of an earlier forward
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind(path)
        os.chmod(path, 0o600)
        server.listen()
    except OSError:
        server.close()
        raise
    return server


class PortForwarder(Actor):
    """An actor that owns point-to-point TCP port forwards; spawn it on this proc, call
    ``forward`` for each forward, and stop it to close them all.

    Example:

        fwd = this_proc().spawn("fwd", PortForwarder)
        fwd.forward.call_one(gpus, 8265, login, "127.0.0.1:8265").get()
        ...
        fwd.stop().get()
    """

    def __init__(self) -> None:
        self._started: list[Any] = []

    @endpoint
    def forward(
        self,
        dst_proc_mesh: Any,
        dst_port: int | Callable[[Any], int],
        src_proc_mesh: Any,
        src_address: str | Callable[[Any], str],
    ) -> None:
        """Each proc of ``src_proc_mesh`` listens on ``src_address`` (``"address:port"``,
        or ``"unix:PATH"`` for a Unix socket of mode 0600) and forwards every
        connection to ``127.0.0.1:dst_port`` on the proc of ``dst_proc_mesh`` at the
        same point. ``dst_port`` and ``src_address`` may be functions of the point.
        Only processes of this user may connect (other hosts too with the
        ``port_forward_allow_remote`` setting); see the module's docstring for the
        limits. ``ValueError`` if the meshes' shapes differ or a fixed port or address
        is malformed."""
        if dst_proc_mesh.extent != src_proc_mesh.extent:
            raise ValueError(
                "destination and source process meshes must have the same shape: "
                f"{dst_proc_mesh.extent} != {src_proc_mesh.extent}"
            )
        if not callable(dst_port):
            _check_port("dst_port", dst_port)
        if not callable(src_address):
            _parse_address(src_address)
        suffix = secrets.token_hex(6)
        spawned: list[Any] = []
        try:
            dest = dst_proc_mesh.spawn(f"port_forward_destination_{suffix}", _Destination)
            spawned.append(dest)
            source = src_proc_mesh.spawn(f"port_forward_source_{suffix}", _Source)
            spawned.append(source)
            dest.configure.call(dst_port).get()
            source.start.call(dest, src_address, _Limits.from_settings()).get()
        except BaseException:
            for mesh in reversed(spawned):
                with contextlib.suppress(Exception):
                    mesh.stop().get()
            raise
        self._started += [source, dest]

    def __cleanup__(self, exc: Any) -> None:
        for mesh in self._started:
            with contextlib.suppress(Exception):
                mesh.stop().get()
        self._started = []
