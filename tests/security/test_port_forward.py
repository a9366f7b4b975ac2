"""``PortForwarder`` against other users on the host and idle connections (issue 40, N3):
only the forwarder's own user may connect, connections are capped and idle ones reset,
and a connection costs no thread (both ends run on an event loop)."""

from __future__ import annotations

import contextlib
import os
import pathlib
import selectors
import shutil
import socket
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from danaus import config
from danaus.actor import Actor, ProcMesh, endpoint, this_host, this_proc
from danaus.job import PortForwarder
from danaus.testing import wait_until

TIMEOUT = 30.0
IDLE = 300
SLACK = 4  # threads a proc may start meanwhile for reasons of its own


class EchoServer:
    """A service answering each connection's bytes in upper case, on one thread (a
    selector): hundreds of connections cost it no thread each."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0), backlog=1024)
        self.sock.setblocking(False)
        self.port = int(self.sock.getsockname()[1])
        self._sel = selectors.DefaultSelector()
        self._sel.register(self.sock, selectors.EVENT_READ)
        self._wake_r, self._wake_w = socket.socketpair()
        self._sel.register(self._wake_r, selectors.EVENT_READ)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            for key, _ in self._sel.select():
                s: Any = key.fileobj
                if s is self._wake_r:
                    for k in list(self._sel.get_map().values()):
                        k.fileobj.close()  # type: ignore[union-attr]
                    self._sel.close()
                    return
                if s is self.sock:
                    with contextlib.suppress(BlockingIOError):
                        conn, _ = s.accept()
                        self._sel.register(conn, selectors.EVENT_READ)
                    continue
                try:
                    data = s.recv(65536)
                    if data:
                        s.sendall(data.upper())
                        continue
                except OSError:
                    pass
                self._sel.unregister(s)
                s.close()

    def close(self) -> None:
        self._wake_w.send(b"x")
        self._thread.join(TIMEOUT)
        self._wake_w.close()


class Pid(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()


@pytest.fixture
def echo() -> Iterator[EchoServer]:
    server = EchoServer()
    yield server
    server.close()


@pytest.fixture
def procs() -> Iterator[ProcMesh]:
    mesh = this_host().spawn_procs(per_host={"gpus": 1})
    yield mesh
    mesh.stop().get(timeout=60)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Forward:
    """A forward from ``src_address`` on ``procs`` to the echo server on the same procs."""

    def __init__(self, procs: ProcMesh, echo: EchoServer, src_address: str) -> None:
        self.fwd = this_proc().spawn(f"fwd_{os.urandom(4).hex()}", PortForwarder)
        self.fwd.forward.call_one(procs, echo.port, procs, src_address).get(timeout=60)

    def stop(self) -> None:
        self.fwd.stop().get(timeout=60)


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)


def _round_trip(s: socket.socket, data: bytes = b"hello") -> bytes:
    """Send ``data``; what comes back (b"" when the forward closed or reset it)."""
    try:
        s.sendall(data)
        return s.recv(65536)
    except (ConnectionResetError, BrokenPipeError):
        return b""


def _connect_and_round_trip(port: int) -> bytes:
    """Connect, send, and return the answer; b"" when the forward reset the connection,
    whether the reset came before ``connect()`` returned (a loaded machine can deliver
    the reset of a just-accepted connection first) or after."""
    try:
        with _connect(port) as s:
            return _round_trip(s)
    except ConnectionResetError:
        return b""


def _as_nobody() -> list[str]:
    """The command that runs a Python script as a second user (nobody)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root (to act as a second user, nobody) and setpriv")
    python = shutil.which("python3", path="/usr/bin:/bin")
    if python is None:
        pytest.skip("needs a system python3 (/usr/bin/python3) that nobody may run")
    return ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--", python]


# What a second user runs: connect, send, print what came back (or why nothing did).
ATTACK = """
import socket, sys
target = sys.argv[1]
try:
    if target.startswith("unix:"):
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(30)
        s.connect(target[5:])
    else:
        s = socket.create_connection(("127.0.0.1", int(target)), timeout=30)
    s.sendall(b"secret please")
    print("got", s.recv(1024))
except OSError as e:
    print("refused", type(e).__name__)
"""


def _attack(target: str) -> str:
    return subprocess.run(
        [*_as_nobody(), "-c", ATTACK, target],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=True,
    ).stdout.strip()


def test_another_user_cannot_connect_through_the_forward(procs: ProcMesh, echo: EchoServer) -> None:
    port = _free_port()
    fwd = Forward(procs, echo, f"127.0.0.1:{port}")
    try:
        answer = _attack(str(port))
        assert "SECRET" not in answer and answer in ("got b''", "refused ConnectionResetError")
        with _connect(port) as mine:  # the forwarder's own user still gets through
            assert _round_trip(mine) == b"HELLO"
    finally:
        fwd.stop()


def test_a_unix_socket_forward_is_its_users_alone(procs: ProcMesh, echo: EchoServer) -> None:
    d = pathlib.Path(tempfile.mkdtemp(prefix="danaus-fwd-"))
    d.chmod(0o755)  # anyone may reach the socket's name: its own mode must keep them out
    path = d / "forward.sock"
    try:
        fwd = Forward(procs, echo, f"unix:{path}")
        try:
            assert (path.stat().st_mode & 0o777) == 0o600
            assert _attack(f"unix:{path}") == "refused PermissionError"
            with socket.socket(socket.AF_UNIX) as mine:
                mine.settimeout(TIMEOUT)
                mine.connect(str(path))
                assert _round_trip(mine) == b"HELLO"
        finally:
            fwd.stop()
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_connections_beyond_the_cap_are_reset(procs: ProcMesh, echo: EchoServer) -> None:
    port = _free_port()
    with config.configured(port_forward_max_connections=2):
        fwd = Forward(procs, echo, f"127.0.0.1:{port}")
    held: list[socket.socket] = []
    try:
        held += [_connect(port) for _ in range(2)]
        assert [_round_trip(s) for s in held] == [b"HELLO", b"HELLO"]
        assert _connect_and_round_trip(port) == b""  # the third is over the cap: reset
        held.pop().close()

        # The closed one's slot frees once the source has seen it close.
        wait_until(
            lambda: _connect_and_round_trip(port), timeout=TIMEOUT, what="a slot to free",
            until=lambda b: b == b"HELLO",
        )  # fmt: skip
    finally:
        for s in held:
            s.close()
        fwd.stop()


def test_an_idle_connection_is_reset(procs: ProcMesh, echo: EchoServer) -> None:
    port = _free_port()
    with config.configured(port_forward_idle_timeout=1.0):
        fwd = Forward(procs, echo, f"127.0.0.1:{port}")
    try:
        with _connect(port) as s:
            assert _round_trip(s) == b"HELLO"
            try:  # nothing more moves: the forward resets it (a timeout here fails)
                assert s.recv(1024) == b""
            except ConnectionResetError:
                pass
    finally:
        fwd.stop()


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def test_300_idle_connections_leave_the_procs_thread_count_flat(
    procs: ProcMesh, echo: EchoServer
) -> None:
    port = _free_port()
    with config.configured(port_forward_max_connections=IDLE + 10):
        fwd = Forward(procs, echo, f"127.0.0.1:{port}")
    pid = procs.spawn("pid", Pid).pid.call_one().get(timeout=60)
    conns: list[socket.socket] = []
    try:
        with _connect(port) as first:  # the forward's loops are running
            assert _round_trip(first) == b"HELLO"
        baseline = _threads(pid)
        for _ in range(IDLE):
            s = _connect(port)
            conns.append(s)
            assert _round_trip(s) == b"HELLO"  # relayed both ways, then left idle
        # Source and destination in one proc: the old forwarder ran 4 threads a connection.
        assert _threads(pid) <= baseline + SLACK
        with _connect(port) as last:
            assert _round_trip(last) == b"HELLO"
    finally:
        for s in conns:
            s.close()
        fwd.stop()
