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
"""

from __future__ import annotations

import contextlib
import queue
import secrets
import socket
import struct
import threading
from collections.abc import Callable
from typing import Any

from .._actor.api.actor import Actor
from .._actor.api.endpoint import endpoint
from .._actor.core.context import current_rank
from .._actor.core.ports import Channel, Port

__all__ = ["PortForwarder"]

_HOST = "127.0.0.1"
_READ = 64 * 1024


def _check_port(name: str, port: Any) -> int:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"{name} must be an integer from 1 through 65535, got {port!r}")
    return port


def _parse_address(address: Any) -> tuple[str, int]:
    if not isinstance(address, str):
        raise ValueError(f"src_address must be 'address:port', got {address!r}")
    host, sep, port = address.rpartition(":")
    if not sep or not host:
        raise ValueError(f"src_address must be 'address:port', got {address!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not port.isdigit():
        raise ValueError(f"src_address's port must be an integer, got {address!r}")
    return host, _check_port("src_address's port", int(port))


def _at_point(value: Any) -> Any:
    return value(current_rank()) if callable(value) else value


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.close()


def _cut(sock: socket.socket, reset: bool) -> None:
    """End a forwarded connection now: threads blocked reading or writing it wake up
    (``shutdown``), and with ``reset`` the peer gets a reset, not a clean close, so it
    fails at once even when it is blocked writing into a full window (a clean close
    would leave it waiting on a closed window until the kernel gives up)."""
    if reset:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    _close(sock)


# Bytes a source may have sent on one connection that its destination has not yet
# written to the service: past this the source stops reading its client until acks come.
_WINDOW = 4 * 1024 * 1024
_EOF = b""  # on a destination's queue: shut the service's side for writing


class _Out:
    """One forwarded connection at its destination: the service's socket, and a writer
    thread that writes the data messages to it in order and acks each chunk written."""

    def __init__(self, sock: socket.socket, back: Port[tuple[str, Any]]) -> None:
        self.sock = sock
        self.back = back
        self.queue: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        threading.Thread(target=self._write, name="danaus-forward-out", daemon=True).start()
        threading.Thread(target=self._pump, name="danaus-forward-back", daemon=True).start()

    def _write(self) -> None:
        while (data := self.queue.get()) is not None:
            try:
                if not data:  # _EOF
                    self.sock.shutdown(socket.SHUT_WR)
                else:
                    self.sock.sendall(data)
                    self.back.send(("ack", len(data)))
            except OSError:
                self.close(reset=True)  # the service went away: the pump tells the source
                return

    def _pump(self) -> None:
        try:
            while data := self.sock.recv(_READ):
                self.back.send(("data", data))
            self.back.send(("eof", b""))
        except OSError:
            self.back.send(("abort", b""))

    def close(self, reset: bool) -> None:
        """End the connection at once (a write or read blocked on it ends too); with
        ``reset``, as a reset the service sees at once."""
        self.queue.put(None)
        _cut(self.sock, reset)


class _Destination(Actor):
    """Connects to the destination service for each forwarded connection.

    Its endpoints never wait on the service: data goes to the connection's writer
    thread, which acks what it has written, so the source holds back (a window of
    ``_WINDOW`` bytes) instead of this actor, and ``close`` or a stop cuts a
    connection whose service does not read at once.
    """

    def __init__(self) -> None:
        self._port: int | None = None
        self._conns: dict[str, _Out] = {}
        self._lock = threading.Lock()

    @endpoint
    def configure(self, dst_port: Any) -> None:
        self._port = _check_port("dst_port", _at_point(dst_port))

    @endpoint
    def open(self, conn: str, back: Port[tuple[str, Any]]) -> None:
        if self._port is None:
            raise RuntimeError("port forward destination is not configured")
        sock = socket.create_connection((_HOST, self._port))
        with self._lock:
            self._conns[conn] = _Out(sock, back)

    @endpoint
    def data(self, conn: str, data: bytes) -> None:
        out = self._conns.get(conn)
        if out is not None and data:
            out.queue.put(data)

    @endpoint
    def eof(self, conn: str) -> None:
        out = self._conns.get(conn)
        if out is not None:
            out.queue.put(_EOF)

    @endpoint
    def close(self, conn: str, reset: bool = False) -> None:
        """End connection ``conn``: cleanly once both sides are done, with a reset when
        its client reset it or went away."""
        with self._lock:
            out = self._conns.pop(conn, None)
        if out is not None:
            out.close(reset)

    def __cleanup__(self, exc: Any) -> None:
        with self._lock:
            conns, self._conns = list(self._conns.values()), {}
        for out in conns:
            out.close(reset=True)  # stopping cuts the connections


class _Source(Actor):
    """Listens at the source address and relays each connection to its destination."""

    def __init__(self) -> None:
        self._server: socket.socket | None = None
        self._dest: Any = None
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()

    @endpoint
    def start(self, destination: Any, src_address: Any) -> None:
        self._dest = destination.slice(**dict(current_rank()))
        host, port = _parse_address(_at_point(src_address))
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
        self._server = server
        threading.Thread(target=self._accept, name="danaus-forward-accept", daemon=True).start()

    def _accept(self) -> None:
        server = self._server
        assert server is not None
        while True:
            try:
                sock, _ = server.accept()
            except OSError:  # closed by __cleanup__
                return
            with self._lock:
                self._conns.add(sock)
            threading.Thread(
                target=self._relay, args=(sock,), name="danaus-forward", daemon=True
            ).start()

    def _relay(self, sock: socket.socket) -> None:
        conn = secrets.token_hex(8)
        back, receiver = Channel[tuple[str, Any]].open()
        dest = self._dest
        receiver._watch(dest._ref.procs[dest._shape.ranks()[0]])  # a lost destination ends it
        try:
            self._dest.open.call_one(conn, back).get()
        except Exception:  # the service refused or the destination is gone: reset the client
            self._drop(sock, reset=True)
            return
        window = threading.Condition()
        state = {"unacked": 0, "over": False}  # bytes sent, not yet written; backward ended

        def backward() -> None:
            while True:
                try:
                    kind, data = receiver.recv().get()
                except Exception:
                    kind, data = "abort", b""
                if kind == "ack":
                    with window:
                        state["unacked"] -= data
                        window.notify_all()
                    continue
                if kind == "data":
                    try:
                        sock.sendall(data)
                    except OSError:  # the client went away: reset the service's side
                        self._dest.close.broadcast(conn, True)
                        self._drop(sock, reset=True)
                    continue
                if kind == "eof":
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_WR)
                else:  # the service reset or the destination was lost: reset the client
                    self._drop(sock, reset=True)
                with window:
                    state["over"] = True
                    window.notify_all()
                return

        back_thread = threading.Thread(target=backward, name="danaus-forward-in", daemon=True)
        back_thread.start()
        try:
            while data := sock.recv(_READ):
                with window:  # hold back while the destination's service is behind
                    window.wait_for(lambda: state["unacked"] < _WINDOW or state["over"])
                    if state["over"]:
                        break
                    state["unacked"] += len(data)
                self._dest.data.broadcast(conn, data)
            else:
                self._dest.eof.broadcast(conn)
        except OSError:  # the client reset the connection: reset the service's side now
            self._dest.close.broadcast(conn, True)
            self._drop(sock, reset=True)
        back_thread.join()
        self._dest.close.broadcast(conn)
        receiver.close()
        self._drop(sock)

    def _drop(self, sock: socket.socket, reset: bool = False) -> None:
        with self._lock:
            self._conns.discard(sock)
        _cut(sock, reset)

    def __cleanup__(self, exc: Any) -> None:
        if self._server is not None:
            with contextlib.suppress(OSError):
                self._server.shutdown(socket.SHUT_RDWR)
            _close(self._server)
        with self._lock:
            conns = list(self._conns)
        for sock in conns:
            self._drop(sock, reset=True)  # stopping cuts the connections


class PortForwarder(Actor):
    """An actor that owns point-to-point TCP port forwards; spawn it on this proc, call
    ``forward`` for each forward, and stop it to close them all.

    Example::

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
        """Each proc of ``src_proc_mesh`` listens on ``src_address`` (``"address:port"``)
        and forwards every connection to ``127.0.0.1:dst_port`` on the proc of
        ``dst_proc_mesh`` at the same point. ``dst_port`` and ``src_address`` may be
        functions of the point. ``ValueError`` if the meshes' shapes differ or a
        fixed port or address is malformed."""
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
            source.start.call(dest, src_address).get()
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
