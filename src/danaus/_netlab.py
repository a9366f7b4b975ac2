"""A host lab on one machine: hosts are network namespaces joined by a bridge.

The one lab the multi-host tests (``tests/multihost/conftest.py``), the benchmarks
and ``scripts/netlab`` share. Topology:

    root namespace (the client)
      dn<tag>b  bridge, 10.231.R.1/24
       ├─ dn<tag>v0 ══ veth ══ dn<tag>p0  in netns dn-<tag>-0, 10.231.R.10/24
       ├─ dn<tag>v1 ══ veth ══ dn<tag>p1  in netns dn-<tag>-1, 10.231.R.11/24
       └─ ...

A bridge (not one routed /30 per host) puts every host on one segment, so
host-to-host traffic needs no IP forwarding in the root namespace (a global
setting the lab must not touch). ``R`` is picked at random among the /24s of
10.231.0.0/16 that no address or route of this machine uses (the next /16 if
none is free), so two labs on one machine do not collide. All traffic stays on
this machine: the lab only ever talks to addresses it created.

Each host's link (its veth pair) is shaped in both directions, on the egress of
each end: ``tc netem`` gives it a one-way delay, a rate and a loss (defaults that
look like a datacenter: 25 us one way, 10 Gbit/s, no loss), settable at run time
with `Host.set_link()`. Traffic between two hosts crosses two links. On a
kernel without ``sch_netem`` (``CONFIG_NET_SCH_NETEM`` unset) the rate falls back
to ``tbf`` and the loss to an ``nftables`` rule in the host's namespace; a delay
cannot be emulated there and asking for one raises `NetemUnavailable`.

Each worker (`start_worker()`) runs in its host's namespace *and* its own
mount namespace (``ip netns exec`` makes one) with a private tmpfs as its socket
directory, so traffic between hosts has to go over TCP, as between machines.

Teardown even when the owner is killed: workers die with the process that
started them (``setpriv --pdeathsig``), and `sweep_stale_networks()` (run
by every new lab) removes the bridges, namespaces and socket directories of
owners that are gone (the bridge's alias names the owning pid; a lab made by
``scripts/netlab up`` names pid 0 and stays until ``scripts/netlab down``).

Stdlib only and imported by no layer of danaus: it drives ``ip``, ``tc``, ``nft``
and ``python -m danaus worker`` as a user would.
"""

from __future__ import annotations

import contextlib
import glob
import ipaddress
import os
import random
import re
import secrets
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

SRC = Path(__file__).resolve().parents[1]
IP = shutil.which("ip") or "/usr/sbin/ip"
TC = shutil.which("tc") or "/usr/sbin/tc"
NFT = shutil.which("nft") or "/usr/sbin/nft"
# Workers run in sessions of their own; if their starter dies without its teardown
# they must die too (SIGKILL when the parent dies, set by setpriv, kept across exec).
SETPRIV = shutil.which("setpriv")
DIE_WITH_PARENT = [SETPRIV, "--pdeathsig", "KILL", "--"] if SETPRIV else []

WORKER_START_TIMEOUT = 30.0
WORKER_STOP_TIMEOUT = 20.0

# Marks the lab's bridges with the pid of the process that owns them (``ip link`` alias).
OWNER_ALIAS = "danaus netlab, owner pid "
# The alias of labs made before the lab became a module; swept the same way.
_OLD_OWNER_ALIAS = "danaus multihost tests, owner pid "


class NetemUnavailable(RuntimeError):
    """The kernel has no ``sch_netem``: a link delay cannot be emulated here."""


def _run(argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(list(argv), capture_output=True, text=True, timeout=20)
    if check and r.returncode != 0:
        raise RuntimeError(f"`{' '.join(argv)}` failed ({r.returncode}): {r.stderr.strip()}")
    return r


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``ip ARGS`` (raises ``RuntimeError`` with its message if ``check`` and it fails)."""
    return _run([IP, *args], check=check)


# -- addresses -----------------------------------------------------------------------


def _used_networks() -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """Every IPv4 network an address or a route of this machine uses (default routes aside)."""
    nets: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
    for line in ip("-4", "-o", "addr", "show").stdout.splitlines():
        words = line.split()
        if "inet" in words:
            nets.append(ipaddress.ip_interface(words[words.index("inet") + 1]).network)
    for line in ip("-4", "route", "show", "table", "all").stdout.splitlines():
        words = line.split()
        if words and words[0] in ("broadcast", "local", "unicast", "anycast", "multicast"):
            words = words[1:]
        if not words or words[0] == "default":
            continue
        with contextlib.suppress(ValueError):
            nets.append(ipaddress.ip_network(words[0], strict=False))
    return nets


def free_subnet() -> ipaddress.IPv4Network | ipaddress.IPv6Network:
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
    raise RuntimeError("no free /24 in 10.231.0.0-10.255.255.255 for the lab's hosts")


# -- links ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Link:
    """How a host's link behaves, in each direction."""

    delay_us: float = 25.0  # one way
    rate: str = "10gbit"  # as tc writes rates: "10gbit", "100mbit", ...
    loss_pct: float = 0.0

    def __post_init__(self) -> None:
        if self.delay_us < 0:
            raise ValueError(f"delay_us must be >= 0, not {self.delay_us}")
        if not 0 <= self.loss_pct <= 100:
            raise ValueError(f"loss_pct must be between 0 and 100, not {self.loss_pct}")
        if not re.fullmatch(r"\d+(\.\d+)?([kmgt]?(bit|bps))", self.rate.lower()):
            raise ValueError(
                f"rate {self.rate!r} is not a tc rate: write e.g. '10gbit', '100mbit', '1mbit'"
            )


DATACENTER = Link()

_netem: bool | None = None


def netem_available() -> bool:
    """Whether this kernel has ``sch_netem`` (tried once, on a veth pair of its own)."""
    global _netem
    if _netem is None:
        a = f"dnprobe{secrets.token_hex(3)}"
        ip("link", "add", a, "type", "veth", "peer", "name", a + "x")
        try:
            r = _run([TC, "qdisc", "add", "dev", a, "root", "netem", "delay", "1us"], check=False)
            _netem = r.returncode == 0
        finally:
            ip("link", "del", a, check=False)
    return _netem


def _shape(dev: str, netns: str | None, link: Link) -> None:
    """Give ``dev``'s egress ``link``'s delay, rate and loss (``netns``: where ``dev`` is)."""
    tc = [TC, *(["-n", netns] if netns else []), "qdisc", "replace", "dev", dev, "root"]
    if netem_available():
        args = ["netem", "delay", f"{link.delay_us}us", "rate", link.rate, "limit", "100000"]
        if link.loss_pct:
            args += ["loss", f"{link.loss_pct}%"]
        _run([*tc, *args])
        return
    # tbf: a bucket of at least 10 ms of traffic (and 64 KiB), so full rate is reachable.
    _run([*tc, "tbf", "rate", link.rate, "burst", _burst(link.rate), "latency", "100ms"])


def _burst(rate: str) -> str:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kmgt]?)(bit|bps)", rate.lower())
    assert m is not None
    scale = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[m[2]]
    bytes_per_s = float(m[1]) * scale / (8 if m[3] == "bit" else 1)
    return str(max(65536, int(bytes_per_s / 100)))


def _nft_table(veth: str) -> str:
    return f"dnnl_{veth}"


def _nft_loss(host: Host, loss_pct: float) -> None:
    """Drop ``loss_pct`` % of the packets arriving at each end of ``host``'s link (0: none).

    On the ingress hook of each end (netdev tables), so a dropped packet is lost on
    the wire, as netem would lose it: the sender sees no error.
    """
    if not os.path.exists(NFT):
        if not loss_pct:
            return  # nothing to set, nor any rule of ours to remove
        raise NetemUnavailable(
            "this kernel has no sch_netem and `nft` is not installed: loss cannot be "
            "emulated (install the Debian package nftables, or use a kernel with netem)"
        )
    table = _nft_table(host.veth)
    sides = [([NFT], host.veth), ([IP, "netns", "exec", host.netns, NFT], host.peer)]
    for nft, _ in sides:
        _run([*nft, "delete", "table", "netdev", table], check=False)
    if not loss_pct:
        return
    rule = f"numgen random mod 1000000 < {round(loss_pct * 10_000)} drop"
    for nft, dev in sides:
        ruleset = (
            f"table netdev {table} {{\n"
            f'  chain loss {{ type filter hook ingress device "{dev}" priority 0; {rule}; }}\n'
            "}\n"
        )
        r = subprocess.run(
            [*nft, "-f", "-"], input=ruleset, capture_output=True, text=True, timeout=20
        )
        if r.returncode != 0:
            raise RuntimeError(f"nft could not set {loss_pct}% loss on {dev}: {r.stderr.strip()}")


# -- hosts and the network -----------------------------------------------------------


@dataclass
class Host:
    """One simulated host: a network namespace joined to the bridge by a veth pair."""

    index: int
    netns: str
    ip: str
    veth: str  # the root-side end: setting it down partitions the host
    peer: str = ""  # the end inside the namespace
    link: Link = DATACENTER
    worker: Any = None  # the worker started there, when someone needs to find it

    @property
    def netns_inode(self) -> int:
        """The inode of the namespace, as ``/proc/self/ns/net`` shows it inside."""
        return os.stat(f"/run/netns/{self.netns}").st_ino

    def partition(self) -> None:
        """Cut the host off from the bridge (and so from the client and every host)."""
        ip("link", "set", self.veth, "down")

    def heal(self) -> None:
        ip("link", "set", self.veth, "up")

    def set_link(
        self,
        delay_us: float | None = None,
        rate: str | None = None,
        loss_pct: float | None = None,
    ) -> Link:
        """Change the link's delay (one way), rate or loss, in both directions, at once.

        What is not given keeps its value; returns the link's new settings.
        Raises `NetemUnavailable` for a delay other than the current one on a
        kernel without ``sch_netem``.
        """
        new = Link(
            delay_us=self.link.delay_us if delay_us is None else delay_us,
            rate=self.link.rate if rate is None else rate,
            loss_pct=self.link.loss_pct if loss_pct is None else loss_pct,
        )
        if not netem_available() and delay_us is not None and delay_us != self.link.delay_us:
            raise NetemUnavailable(
                f"cannot give {self.netns}'s link a {delay_us} us delay: this kernel has no "
                "sch_netem (CONFIG_NET_SCH_NETEM is not set, and no module can be loaded); "
                "rate (tbf) and loss (nftables) still work"
            )
        if not netem_available() and new.loss_pct and not os.path.exists(NFT):
            _nft_loss(self, new.loss_pct)  # raises, naming what to install; nothing changed
        _shape(self.veth, None, new)
        _shape(self.peer, self.netns, new)
        if not netem_available():
            _nft_loss(self, new.loss_pct)
        self.link = new
        return new

    def exec_argv(self, *argv: str) -> list[str]:
        """``argv`` run inside the host's namespace."""
        return [IP, "netns", "exec", self.netns, *argv]


@dataclass
class Network:
    """The lab: a bridge and the hosts on it; ``tag`` names all its pieces."""

    tag: str
    subnet: ipaddress.IPv4Network | ipaddress.IPv6Network
    hosts: list[Host] = field(default_factory=list)
    link: Link = DATACENTER  # what new hosts get
    owner_pid: int = field(default_factory=os.getpid)
    _next: int = 0

    @classmethod
    def make(cls, link: Link = DATACENTER, owner_pid: int | None = None) -> Network:
        """A new lab on a free /24, after sweeping those whose owner died."""
        check_netns_allowed()
        sweep_stale_networks()
        net = cls(secrets.token_hex(3), free_subnet(), link=link)
        if owner_pid is not None:
            net.owner_pid = owner_pid
        net.create()
        return net

    @property
    def bridge(self) -> str:
        return f"dn{self.tag}b"

    @property
    def gateway(self) -> str:
        """The bridge's address: the client's, as the hosts see it."""
        return str(self.subnet.network_address + 1)

    def create(self) -> None:
        ip("link", "add", self.bridge, "type", "bridge")
        try:
            ip("link", "set", "dev", self.bridge, "alias", f"{OWNER_ALIAS}{self.owner_pid}")
            ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            ip("link", "set", self.bridge, "up")
        except BaseException:
            ip("link", "del", self.bridge, check=False)
            raise

    def add_host(self, link: Link | None = None) -> Host:
        k = self._next
        self._next += 1
        ns, veth, peer = f"dn-{self.tag}-{k}", f"dn{self.tag}v{k}", f"dn{self.tag}p{k}"
        address = str(self.subnet.network_address + 10 + k)
        host = Host(k, ns, address, veth, peer)
        ip("netns", "add", ns)
        self.hosts.append(host)
        ip("link", "add", veth, "type", "veth", "peer", "name", peer)
        ip("link", "set", peer, "netns", ns)
        ip("link", "set", veth, "master", self.bridge)
        ip("link", "set", veth, "up")
        ip("-n", ns, "addr", "add", f"{address}/24", "dev", peer)
        ip("-n", ns, "link", "set", "lo", "up")
        ip("-n", ns, "link", "set", peer, "up")
        want = link or self.link
        if not netem_available():  # no delay to give: keep the rate and loss
            want = replace(want, delay_us=0.0)
        host.link = replace(want, loss_pct=0.0, rate="1gbit")  # anything, replaced below
        host.set_link(delay_us=want.delay_us, rate=want.rate, loss_pct=want.loss_pct)
        return host

    def remove_host(self, host: Host) -> None:
        if os.path.exists(NFT):  # its loss rule on the root-side end, if any
            _run([NFT, "delete", "table", "netdev", _nft_table(host.veth)], check=False)
        ip("link", "del", host.veth, check=False)  # deletes both ends
        ip("netns", "del", host.netns, check=False)
        if host in self.hosts:
            self.hosts.remove(host)

    def destroy(self) -> None:
        for host in list(self.hosts):
            self.remove_host(host)
        ip("link", "del", self.bridge, check=False)


def check_netns_allowed() -> None:
    """Raise ``PermissionError`` (or ``RuntimeError``) unless namespaces can be made here."""
    probe = f"dn-{secrets.token_hex(3)}-probe"
    r = ip("netns", "add", probe, check=False)
    if r.returncode != 0:
        if "ermission" in r.stderr or "not permitted" in r.stderr:
            raise PermissionError(
                f"network namespaces are not allowed here (the lab needs root): {r.stderr.strip()}"
            )
        raise RuntimeError(f"`ip netns add` failed: {r.stderr.strip()}")
    ip("netns", "del", probe)


def lab_bridges() -> list[tuple[str, int]]:
    """``(tag, owner pid)`` of every lab bridge on this machine (pid 0: made by ``up``)."""
    aliases = "|".join(re.escape(a) for a in (OWNER_ALIAS, _OLD_OWNER_ALIAS))
    pattern = re.compile(rf"^\d+: dn([0-9a-f]{{6}})b[:@].*alias (?:{aliases})(\d+)")
    out = []
    for line in ip("-o", "link", "show", "type", "bridge").stdout.splitlines():
        m = pattern.search(line)
        if m is not None:
            out.append((m[1], int(m[2])))
    return out


def remove_lab(tag: str) -> None:
    """Remove lab ``tag``: its bridge, namespaces (with their veths) and socket directories."""
    for entry in ip("netns", "list").stdout.splitlines():
        name = entry.split()[0] if entry.strip() else ""
        if name.startswith(f"dn-{tag}-"):
            ip("netns", "del", name, check=False)  # takes its veth pair along
    ip("link", "del", f"dn{tag}b", check=False)
    if os.path.exists(NFT):  # the loss rules of its hosts' links, if any
        tables = _run([NFT, "list", "tables", "netdev"], check=False).stdout.split()
        for name in tables:
            if name.startswith(f"dnnl_dn{tag}v"):
                _run([NFT, "delete", "table", "netdev", name], check=False)
    for path in glob.glob(f"/tmp/dn-{tag}-*-sock"):
        shutil.rmtree(path, ignore_errors=True)


def sweep_stale_networks() -> None:
    """Remove the labs of earlier runs that died before their teardown.

    Only those whose owner process is gone (their workers died with it, pdeathsig);
    never a lab made by ``scripts/netlab up`` (owner pid 0).
    """
    for tag, pid in lab_bridges():
        if pid != 0 and not os.path.exists(f"/proc/{pid}"):
            remove_lab(tag)
