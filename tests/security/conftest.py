"""Fixtures for the security suite: runtimes in this process, and a relay that sits
on the path between two of them (as an attacker on the network would).

Everything listens and connects on 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from danaus._runtime.messaging.runtime import Runtime
from danaus._transport.address import make_job_dir
from danaus._transport.auth import MAGIC, TAG
from danaus._wire.frame import encode_frame
from danaus._wire.ids import ProcId
from danaus._wire.protocol import Bounce, Kind, Message, Refused, wire
from wire_bytes import recv_exactly

SECRET = b"0123456789abcdef" * 4
# The test runtimes take over two kinds: REFUSED frames (one string field) are
# recorded, BOUNCE frames (no handler in a bare runtime) answered on the same
# connection, so frames flow both ways. Tests send them typed (``note``, ``ping``)
# or by hand as wire tuples.
KIND = int(Kind.REFUSED)
ECHO = int(Kind.BOUNCE)


def note(text: str) -> Refused:
    """A frame the receiving test runtime records as ``(KIND, text)``."""
    return Refused(text)


def ping(text: str) -> Bounce:
    """A frame the receiving test runtime answers with ``(KIND, "echo " + text)``."""
    return Bounce(None, text, "")  # type: ignore[arg-type]


TIMEOUT = 20.0
CHALLENGE = len(MAGIC) + 32
RESPONSE = 64
CONFIRM = 32


@dataclass
class Node:
    """A runtime on its own I/O thread, listening on 127.0.0.1, recording KIND frames."""

    rt: Runtime
    got: queue.Queue[tuple[Any, ...]] = field(default_factory=queue.Queue)

    @property
    def tcp(self) -> ProcId:
        """This runtime reached over TCP only (no Unix entry, no host token)."""
        entry = next(e for e in self.rt.proc_id.addr.split(";") if e.startswith("tcp://"))
        return ProcId(self.rt.proc_id.name, entry)

    @property
    def port(self) -> int:
        return int(self.tcp.addr.rsplit(":", 1)[1])

    def on_io(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the I/O thread and return its result."""
        done: queue.Queue[Any] = queue.Queue()
        self.rt.call_soon(lambda: done.put(fn()))
        return done.get(timeout=TIMEOUT)


def make_node(name: str, secret: bytes | None = SECRET, listen: bool = True) -> Node:
    rt = Runtime(name, make_job_dir(), secret=secret)
    node = Node(rt)

    def record(conn: Any, msg: Message) -> None:
        node.got.put((int(msg.kind), *msg.header))

    def echo(conn: Any, msg: Message) -> None:
        conn.send(encode_frame(wire(note("echo " + msg.header.dest))))

    rt.handlers[Kind.REFUSED] = record  # replaces the runtime's own handlers (a test)
    rt.handlers[Kind.BOUNCE] = echo
    rt.start(in_thread=True)
    if listen:
        rt.listen_tcp("127.0.0.1", "127.0.0.1")
    return node


def stop_node(node: Node) -> None:
    rt = node.rt

    def close_all() -> None:
        rt.close()
        for conn in rt.links.all_connections():
            conn.close()
        rt.loop.stop()

    rt.call_soon(close_all)
    assert rt.thread is not None
    rt.thread.join(TIMEOUT)
    rt.loop.close()
    with contextlib.suppress(OSError):
        os.rmdir(rt.job_dir)


@pytest.fixture
def nodes() -> Iterator[Callable[..., Node]]:
    made: list[Node] = []

    def make(name: str, **kw: Any) -> Node:
        node = make_node(name, **kw)
        made.append(node)
        return node

    yield make
    for node in made:
        stop_node(node)


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """An asyncio loop running on a thread of its own (as a runtime's I/O thread)."""
    lp = asyncio.new_event_loop()
    t = threading.Thread(target=lp.run_forever, daemon=True)
    t.start()
    yield lp
    lp.call_soon_threadsafe(lp.stop)
    t.join(TIMEOUT)
    lp.close()


def read_frame_bytes(sock: socket.socket, tagged: bool = True) -> bytes:
    """One whole frame off an authenticated stream, as its raw bytes (tag included)."""
    prefix = recv_exactly(sock, 8)
    (total,) = struct.unpack("<Q", prefix)
    return prefix + recv_exactly(sock, total + (TAG if tagged else 0))


def wait_closed(sock: socket.socket, timeout: float = TIMEOUT) -> bytes:
    """Read until the peer closes (EOF or reset); returns what came meanwhile."""
    sock.settimeout(timeout)
    rest = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            rest += chunk
    return rest


class Relay:
    """An on-path attacker between a client runtime and a server's TCP port.

    It accepts the client's connections, opens one to the server for each, and
    relays the handshake byte for byte (so both ends authenticate each other),
    then relays frames one by one, keeping a copy of each. The test then
    injects bytes of its own into a spliced connection.
    """

    def __init__(self, server_port: int) -> None:
        self.server_port = server_port
        self.lsock = socket.create_server(("127.0.0.1", 0))
        self.port = self.lsock.getsockname()[1]
        self.links: queue.Queue[Link] = queue.Queue()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self.lsock.accept()
            except OSError:
                return
            s = socket.create_connection(("127.0.0.1", self.server_port), timeout=TIMEOUT)
            self.links.put(Link(c, s))

    def close(self) -> None:
        self.lsock.close()


class Link:
    """One relayed connection: ``client`` is the client's socket, ``server`` the server's."""

    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client, self.server = client, server
        self.lock = threading.Lock()  # one writer at a time towards the server
        client.settimeout(TIMEOUT)
        # The handshake, relayed unchanged: both ends are satisfied.
        client.sendall(recv_exactly(server, CHALLENGE))
        server.sendall(recv_exactly(client, RESPONSE))
        client.sendall(recv_exactly(server, CONFIRM))
        self.to_server: queue.Queue[bytes] = queue.Queue()  # frames the client sent
        self.to_client: queue.Queue[bytes] = queue.Queue()  # frames the server sent
        self.server_closed = threading.Event()
        threading.Thread(target=self._up, daemon=True).start()
        threading.Thread(target=self._down, daemon=True).start()

    def _up(self) -> None:
        with contextlib.suppress(OSError, EOFError):
            while True:
                frame = read_frame_bytes(self.client)
                with self.lock:
                    self.server.sendall(frame)
                self.to_server.put(frame)

    def _down(self) -> None:
        try:
            while True:
                frame = read_frame_bytes(self.server)
                self.client.sendall(frame)
                self.to_client.put(frame)
        except (OSError, EOFError):
            self.server_closed.set()

    def inject(self, data: bytes) -> None:
        with self.lock:
            self.server.sendall(data)


@pytest.fixture
def relay() -> Iterator[Callable[[int], Relay]]:
    made: list[Relay] = []

    def make(port: int) -> Relay:
        r = Relay(port)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Leave this directory's ``slow`` tests out unless a ``-m`` expression is given."""
    if config.getoption("markexpr"):
        return
    here = Path(__file__).parent
    slow = [i for i in items if i.get_closest_marker("slow") and here in i.path.parents]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [i for i in items if i not in slow]


@pytest.fixture
def rdma_memory() -> Iterator[Any]:
    """Registered memory (``_rdma.registry.BufferRegistry``) that ``data_server`` serves."""
    from danaus._rdma.registry import BufferRegistry

    memory = BufferRegistry()
    yield memory
    memory.on_node_end()


@pytest.fixture
def data_server(nodes, rdma_memory) -> Iterator[Callable[[], tuple[Node, tuple[str, int]]]]:
    """RDMA data servers (``_rdma.net._Server``) on fresh nodes, closed at the end;
    they serve ``rdma_memory``."""
    from danaus._rdma import net

    made: list[net._Server] = []

    def make() -> tuple[Node, tuple[str, int]]:
        node = nodes("owner")
        server = node.on_io(lambda: net._Server(node.rt, rdma_memory))
        made.append(server)
        return node, server.address

    yield make
    for server in made:
        server.close()
