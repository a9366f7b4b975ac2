"""Fixtures for the multi-host tests: hosts are network namespaces on this machine.

The hosts are those of the project's host lab, ``danaus._netlab`` (which the
benchmarks and ``scripts/netlab`` use too): a bridge, one network namespace per
host joined to it by a veth pair, links shaped like a datacenter's, a worker in
each host's own network and mount namespace, everything torn down even when
pytest is killed. See its docstring for the topology. The bridge is built once
per session; tests may add hosts of their own (``fresh_worker``).

The client's heartbeat is set to match the workers' (0.2 s interval, 2 s
timeout), and a recording ``unhandled_fault_hook`` replaces the default one
(which would end pytest). A test that causes failures waits for them; a
failure nobody waited for fails the test during which it arrived.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import secrets
import socket
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

import danaus.actor
import danaus.config
from danaus import _netlab_workers
from danaus._netlab import (  # noqa: F401  (the tests import these from here)
    IP,
    SRC,
    Host,
    Network,
)
from danaus._netlab import ip as _ip  # noqa: F401
from danaus._netlab_workers import Worker, python_path
from danaus._runtime.node import this_node
from danaus.actor import (
    Actor,
    HostMesh,
    ProcMesh,
    attach_to_workers,
    context,
    current_rank,
    endpoint,
)
from danaus.testing import (
    FaultRecorder,
    wait_pids_gone,  # noqa: F401  (the tests import it from here)
)

# Bound on any single wait: far above what a healthy call or report needs.
TIMEOUT = 20.0
HEARTBEAT_INTERVAL = 0.2
HEARTBEAT_TIMEOUT = 2.0


# -- the network (the lab: danaus._netlab) ---------------------------------------


@pytest.fixture(scope="session")
def network() -> Iterator[Network]:
    """The bridge, for the session; hosts are added by ``net`` and by tests."""
    try:
        net = Network.make()
    except PermissionError as e:
        pytest.skip(str(e))
    try:
        yield net
    finally:
        net.destroy()


# -- workers -----------------------------------------------------------------------

# The client's heartbeats (set by ``client``) and the workers' match.
WORKER_SETTINGS = {
    "DANAUS_HEARTBEAT_INTERVAL": str(HEARTBEAT_INTERVAL),
    "DANAUS_HEARTBEAT_TIMEOUT": str(HEARTBEAT_TIMEOUT),
}


def start_worker(host: Host, secret: str) -> Worker:
    """Start ``danaus worker`` in ``host``'s namespace, heartbeats like the client's."""
    return _netlab_workers.start_worker(host, secret, WORKER_SETTINGS)


def _worker_env(secret: str, socket_dir: str) -> dict[str, str]:
    """A worker's environment here (``tests/jobs`` starts workers of its own with it)."""
    return _netlab_workers.worker_env(secret, socket_dir, WORKER_SETTINGS)


_reap = _netlab_workers.reap


@pytest.fixture(scope="session")
def secret() -> str:
    """The job secret of every worker of this session.

    A client holds one job secret: reuse it if another suite attached first.
    """
    rt = this_node().runtime
    return rt.secret.decode() if rt.secret is not None else secrets.token_hex(32)


@pytest.fixture(scope="session")
def net(network: Network) -> list[Host]:
    """Three hosts, shared by the session."""
    return [network.add_host() for _ in range(3)]


@pytest.fixture(scope="session")
def workers(net: list[Host], secret: str) -> Iterator[list[Worker]]:
    started: list[Worker] = []
    try:
        for host in net:
            started.append(start_worker(host, secret))
        yield started
    finally:
        for w in started:
            _reap(w)


@pytest.fixture
def fresh_worker(network: Network, secret: str) -> Iterator[Callable[..., Worker]]:
    """``fresh_worker(host=None)``: a worker of this test's own, on ``host`` or a new host.

    For tests that kill or partition a worker: the shared ones must stay healthy.
    """
    started: list[Worker] = []
    own_hosts: list[Host] = []

    def start(host: Host | None = None) -> Worker:
        if host is None:
            host = network.add_host()
            own_hosts.append(host)
        w = start_worker(host, secret)
        started.append(w)
        return w

    yield start
    for w in started:
        _reap(w)
    for host in own_hosts:
        network.remove_host(host)


# -- the client ----------------------------------------------------------------------


@pytest.fixture(scope="package")  # the short heartbeats end with this package's tests
def client() -> Iterator[FaultRecorder]:
    """This process as a client: heartbeats like the workers', failures recorded.

    ``Runtime._heartbeat`` reads both settings at every tick, so configuring
    them here takes effect from the next tick on.
    """
    mp = pytest.MonkeyPatch()
    recorder = FaultRecorder()
    mp.setattr(danaus.actor, "unhandled_fault_hook", recorder)
    try:
        with danaus.config.configured(
            heartbeat_interval=HEARTBEAT_INTERVAL, heartbeat_timeout=HEARTBEAT_TIMEOUT
        ):
            yield recorder
    finally:
        mp.undo()


@pytest.fixture(autouse=True)
def faults(client: FaultRecorder) -> Iterator[FaultRecorder]:
    client.mark_seen()
    yield client
    extra = client.unseen()
    client.mark_seen()
    if extra:
        pytest.fail(f"unexpected failure(s) reached the client: {[str(f) for f in extra]}")


def attach(workers: Iterable[Worker], secret: str, timeout: float = TIMEOUT) -> HostMesh:
    workers = list(workers)
    # A client advertises one TCP address, chosen when it first attaches: one
    # chosen for loopback workers (another suite's) cannot be reached from here.
    advertised = this_node().runtime.tcp_advertise
    subnet = ipaddress.ip_interface(f"{workers[0].host.ip}/24").network
    if advertised is not None and ipaddress.ip_address(advertised) not in subnet:
        pytest.fail(
            f"this client already advertises {advertised} (another suite attached to workers "
            f"first), which the hosts on {subnet} cannot reach; run tests/multihost first or alone"
        )
    hm = attach_to_workers(workers=[w.address for w in workers], secret=secret)
    assert hm.initialized.get(timeout=timeout) is True
    return hm


@pytest.fixture(scope="package")
def hosts(client: FaultRecorder, workers: list[Worker], secret: str) -> Iterator[HostMesh]:
    """The shared workers, attached: ``{"hosts": 3}``."""
    hm = attach(workers, secret)
    yield hm
    hm.shutdown().get(timeout=TIMEOUT)


@pytest.fixture(scope="package")
def procs(hosts: HostMesh) -> ProcMesh:
    """Two procs on each shared host, ``{"hosts": 3, "gpus": 2}``, for tests that break nothing."""
    pm = hosts.spawn_procs(per_host={"gpus": 2})
    assert pm.initialized.get(timeout=TIMEOUT) is True
    return pm  # stopped by ``hosts.shutdown()``


@pytest.fixture
def attach_fresh(client: FaultRecorder, secret: str) -> Iterator[Callable[..., HostMesh]]:
    """``attach_fresh(workers)``: a host mesh of this test's own, shut down at teardown."""
    meshes: list[HostMesh] = []

    def make(ws: Iterable[Worker], timeout: float = TIMEOUT) -> HostMesh:
        hm = attach(ws, secret, timeout)
        meshes.append(hm)  # only once attached: shutdown() waits for the attach
        return hm

    yield make
    for hm in meshes:
        with contextlib.suppress(Exception):
            hm.shutdown().get(timeout=TIMEOUT)


# -- actors ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Facts:
    """Where an actor runs, as the kernel sees it."""

    rank: int  # the actor's rank in its whole mesh
    coords: dict[str, int]  # its coordinates in its whole mesh
    message_coords: dict[str, int]  # in the mesh (or slice) the message was sent to
    pid: int
    netns_inode: int
    tcp: str  # the TCP entry of its proc's address ("" if none)
    unix: str  # the path of its proc's Unix socket


def where_am_i() -> Facts:
    addr = context().actor_instance.actor_id.addr
    entries = addr.split(";")
    tcp = next((e for e in entries if e.startswith("tcp://")), "")
    unix = next((e[len("unix:") :] for e in entries if e.startswith("unix:")), "")
    link = os.readlink("/proc/self/ns/net")  # "net:[4026532...]"
    own = context().actor_instance.rank
    return Facts(own.rank, dict(own), dict(current_rank()), os.getpid(), int(link[5:-1]), tcp, unix)


class Probe(Actor):
    """Reports where it runs; echoes; records what it is sent, in order."""

    def __init__(self) -> None:
        self.log: list[int] = []

    @endpoint
    def facts(self) -> Facts:
        return where_am_i()

    @endpoint
    def echo(self, value: Any) -> Any:
        return value

    @endpoint
    def record(self, seq: int) -> int:
        self.log.append(seq)
        return seq

    @endpoint
    def recorded(self) -> list[int]:
        return list(self.log)

    @endpoint
    def pid(self) -> int:
        return os.getpid()


def client_env() -> dict[str, str]:
    """The environment of a client subprocess: this danaus, no inherited danaus settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DANAUS_")}
    env["PYTHONPATH"] = python_path()
    env["PYTHONUNBUFFERED"] = "1"
    return env


def recv_until_closed(sock: socket.socket, timeout: float) -> tuple[bytes, float]:
    """Read until the peer closes (EOF or reset); returns what came and how long it took.

    Raises ``AssertionError`` if the connection is still open after ``timeout``.
    """
    start = time.monotonic()
    got = b""
    while True:
        left = timeout - (time.monotonic() - start)
        if left <= 0:
            raise AssertionError(f"the peer kept the connection open for {timeout} s")
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            raise AssertionError(f"the peer kept the connection open for {timeout} s") from None
        except ConnectionResetError:
            return got, time.monotonic() - start
        if not chunk:
            return got, time.monotonic() - start
        got += chunk
