"""Fixtures for the multi-host tests: hosts are network namespaces on this machine.

Topology (built once per session, torn down at its end, even on failure)::

    root namespace (the pytest process is the client)
      dn<tag>b  bridge, 10.231.R.1/24
       ├─ dn<tag>v0 ══ veth ══ dn<tag>p0  in netns dn-<tag>-0, 10.231.R.10/24
       ├─ dn<tag>v1 ══ veth ══ dn<tag>p1  in netns dn-<tag>-1, 10.231.R.11/24
       └─ ...                             (tests may add more hosts of their own)

A bridge (not one routed /30 per host) puts every host on one segment, so
host-to-host traffic needs no IP forwarding in the root namespace (a global
setting we must not touch). ``R`` is picked at random among the /24s of
10.231.0.0/16 that no address or route of this machine uses (the next /16 if
none is free), so two runs on one machine do not collide. Setting a host's
root-side veth down partitions that host from the client and from every
other host.

Each worker runs in its namespace *and* its own mount namespace (``ip netns
exec`` makes one) with a private tmpfs as its socket directory, so a worker's
Unix sockets are invisible to the other "hosts": traffic between hosts has to
go over TCP, as it would between machines.

All traffic stays on this machine: the client and the workers only ever talk
to addresses this fixture created.

If pytest dies without its teardown (SIGKILL), its workers die with it
(``setpriv --pdeathsig``), and the next run removes the bridge, namespaces
and socket directories it left (the bridge's alias names the owning pid).

The client's heartbeat is set to match the workers' (0.2 s interval, 2 s
timeout), and a recording ``unhandled_fault_hook`` replaces the default one
(which would end pytest). A test that causes failures waits for them; a
failure nobody waited for fails the test during which it arrived.
"""

from __future__ import annotations

import contextlib
import glob
import ipaddress
import os
import queue
import random
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import danaus.actor
import danaus.config
from danaus._runtime.hosting.host import ensure_runtime
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

SRC = Path(danaus.actor.__file__).resolve().parents[1]
IP = shutil.which("ip") or "/usr/sbin/ip"
# Workers run in sessions of their own; if pytest dies without its teardown they
# must die too (SIGKILL when the parent dies, set by setpriv, kept across exec).
SETPRIV = shutil.which("setpriv")
DIE_WITH_PYTEST = [SETPRIV, "--pdeathsig", "KILL", "--"] if SETPRIV else []

# Bound on any single wait: far above what a healthy call or report needs.
TIMEOUT = 20.0
WORKER_START_TIMEOUT = 30.0
HEARTBEAT_INTERVAL = 0.2
HEARTBEAT_TIMEOUT = 2.0


# -- the network ---------------------------------------------------------------------


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([IP, *args], capture_output=True, text=True, check=check, timeout=20)


def _used_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network an address or a route of this machine uses (default routes aside)."""
    nets = []
    for line in _ip("-4", "-o", "addr", "show").stdout.splitlines():
        words = line.split()
        if "inet" in words:
            nets.append(ipaddress.ip_interface(words[words.index("inet") + 1]).network)
    for line in _ip("-4", "route", "show", "table", "all").stdout.splitlines():
        words = line.split()
        if words and words[0] in ("broadcast", "local", "unicast", "anycast", "multicast"):
            words = words[1:]
        if not words or words[0] == "default":
            continue
        with contextlib.suppress(ValueError):
            nets.append(ipaddress.ip_network(words[0], strict=False))
    return nets


def _free_subnet() -> ipaddress.IPv4Network:
    """A random /24 of 10.231.0.0/16 that nothing here uses (else of 10.232/16, ...)."""
    used = _used_networks()
    for block in range(231, 256):
        free = [
            net
            for net in ipaddress.ip_network(f"10.{block}.0.0/16").subnets(new_prefix=24)
            if not any(net.overlaps(u) for u in used)
        ]
        if free:
            return random.choice(free)
    raise RuntimeError("no free /24 in 10.231.0.0-10.255.255.255 for the test hosts")


@dataclass
class Host:
    """One simulated host: a network namespace joined to the bridge by a veth pair."""

    index: int
    netns: str
    ip: str
    veth: str  # the root-side end: setting it down partitions the host
    worker: Any = None  # the worker a test started there, when it needs to find it

    @property
    def netns_inode(self) -> int:
        """The inode of the namespace, as ``/proc/self/ns/net`` shows it inside."""
        return os.stat(f"/run/netns/{self.netns}").st_ino

    def partition(self) -> None:
        _ip("link", "set", self.veth, "down")

    def heal(self) -> None:
        _ip("link", "set", self.veth, "up")


@dataclass
class Network:
    tag: str
    subnet: ipaddress.IPv4Network
    hosts: list[Host] = field(default_factory=list)
    _next: int = 0

    @property
    def bridge(self) -> str:
        return f"dn{self.tag}b"

    @property
    def gateway(self) -> str:
        return str(self.subnet.network_address + 1)

    def create(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("link", "set", "dev", self.bridge, "alias", f"{OWNER_ALIAS}{os.getpid()}")
        _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")

    def add_host(self) -> Host:
        k = self._next
        self._next += 1
        ns, veth, peer = f"dn-{self.tag}-{k}", f"dn{self.tag}v{k}", f"dn{self.tag}p{k}"
        ip = str(self.subnet.network_address + 10 + k)
        host = Host(k, ns, ip, veth)
        _ip("netns", "add", ns)
        self.hosts.append(host)
        _ip("link", "add", veth, "type", "veth", "peer", "name", peer)
        _ip("link", "set", peer, "netns", ns)
        _ip("link", "set", veth, "master", self.bridge)
        _ip("link", "set", veth, "up")
        _ip("-n", ns, "addr", "add", f"{ip}/24", "dev", peer)
        _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", ns, "link", "set", peer, "up")
        return host

    def remove_host(self, host: Host) -> None:
        _ip("link", "del", host.veth, check=False)  # deletes both ends
        _ip("netns", "del", host.netns, check=False)
        if host in self.hosts:
            self.hosts.remove(host)

    def destroy(self) -> None:
        for host in list(self.hosts):
            self.remove_host(host)
        _ip("link", "del", self.bridge, check=False)


# Marks our bridges with the pid of the run that made them (``ip link`` alias).
OWNER_ALIAS = "danaus multihost tests, owner pid "


def _sweep_stale_networks() -> None:
    """Remove the bridges and namespaces of earlier runs that died before their teardown.

    Only those whose owner process is gone; their workers died with it (pdeathsig).
    """
    pattern = re.compile(rf"^\d+: dn([0-9a-f]{{6}})b[:@].*alias {OWNER_ALIAS}(\d+)")
    for line in _ip("-o", "link", "show", "type", "bridge").stdout.splitlines():
        m = pattern.search(line)
        if m is None or os.path.exists(f"/proc/{m[2]}"):
            continue
        tag = m[1]
        for entry in _ip("netns", "list").stdout.splitlines():
            name = entry.split()[0] if entry.strip() else ""
            if name.startswith(f"dn-{tag}-"):
                _ip("netns", "del", name, check=False)  # takes its veth pair along
        _ip("link", "del", f"dn{tag}b", check=False)
        for path in glob.glob(f"/tmp/dn-{tag}-*-sock"):
            with contextlib.suppress(OSError):
                os.rmdir(path)


@pytest.fixture(scope="session")
def network() -> Iterator[Network]:
    """The bridge, for the session; hosts are added by ``net`` and by tests."""
    tag = secrets.token_hex(3)
    probe = f"dn-{tag}-probe"
    r = _ip("netns", "add", probe, check=False)
    if r.returncode != 0:
        if "ermission" in r.stderr or "not permitted" in r.stderr:
            pytest.skip(f"network namespaces are not allowed here: {r.stderr.strip()}")
        raise RuntimeError(f"`ip netns add` failed: {r.stderr.strip()}")
    _ip("netns", "del", probe)
    _sweep_stale_networks()
    net = Network(tag, _free_subnet())
    try:
        net.create()
        yield net
    finally:
        net.destroy()


# -- workers -----------------------------------------------------------------------


@dataclass
class Worker:
    host: Host
    proc: subprocess.Popen[str]
    address: str
    socket_dir: str

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)  # its own session: worker + zygote
        self.proc.wait(timeout=TIMEOUT)


def _worker_env(secret: str, socket_dir: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DANAUS_")}
    env.update(
        DANAUS_SECRET=secret,
        DANAUS_HEARTBEAT_INTERVAL=str(HEARTBEAT_INTERVAL),
        DANAUS_HEARTBEAT_TIMEOUT=str(HEARTBEAT_TIMEOUT),
        DANAUS_SOCKET_DIR=socket_dir,
        PYTHONPATH=os.pathsep.join(
            [str(SRC), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        ),
        PYTHONUNBUFFERED="1",
    )
    return env


# Inside the worker's own mount namespace: a private tmpfs for its Unix sockets.
_WORKER_SH = (
    'mount -t tmpfs -o mode=0700 danaus "$DANAUS_SOCKET_DIR" && '
    'exec "$0" -m danaus worker --listen "$1"'
)


def start_worker(host: Host, secret: str) -> Worker:
    """Start ``danaus worker`` in ``host``'s namespace; returns once it listens."""
    socket_dir = f"/tmp/{host.netns}-{secrets.token_hex(3)}-sock"
    os.mkdir(socket_dir, 0o700)
    argv = [IP, "netns", "exec", host.netns, "sh", "-c", _WORKER_SH, sys.executable]
    proc = subprocess.Popen(
        [*DIE_WITH_PYTEST, *argv, f"tcp://{host.ip}:0"],
        env=_worker_env(secret, socket_dir),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    assert proc.stdout is not None
    stream = proc.stdout

    def read_first_line() -> None:
        try:
            lines.put(stream.readline())
        except (OSError, ValueError):  # closed under us: the worker was given up on
            lines.put("")

    threading.Thread(target=read_first_line, daemon=True).start()
    try:
        line = lines.get(timeout=WORKER_START_TIMEOUT)
    except queue.Empty:
        line = ""
    prefix = "danaus worker listening on "
    if not line.startswith(prefix):
        _reap(Worker(host, proc, "", socket_dir))
        raise RuntimeError(
            f"the worker in {host.netns} did not start within {WORKER_START_TIMEOUT} s "
            f"(exit code {proc.poll()}, said {line!r})"
        )
    address = line[len(prefix) :].strip()
    assert address.startswith(f"tcp://{host.ip}:"), address
    return Worker(host, proc, address, socket_dir)


def _reap(worker: Worker) -> None:
    try:
        worker.kill()
    finally:
        if worker.proc.stdout is not None:
            worker.proc.stdout.close()
        with contextlib.suppress(OSError):
            os.rmdir(worker.socket_dir)  # its tmpfs is only mounted in the worker's namespace


@pytest.fixture(scope="session")
def secret() -> str:
    """The job secret of every worker of this session.

    A client holds one job secret: reuse it if another suite attached first.
    """
    rt = ensure_runtime()
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
    advertised = ensure_runtime().tcp_advertise
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
    env["PYTHONPATH"] = os.pathsep.join(
        [str(SRC), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    )
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
