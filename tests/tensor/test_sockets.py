"""The sockets gloo opens for the tensor engine stay on the interface the mesh uses: loopback
for procs reached only on this host, else the interface of the address they advertise (as
in the whole suite, after tests/multihost made this client reachable from other hosts)."""

from __future__ import annotations

import os
import socket

import pytest

import danaus
from danaus._runtime.node import this_node
from danaus._transport.ifaces import mesh_interface
from danaus.actor import Actor, ProcMesh, endpoint

from .conftest import REPLY_TIMEOUT, base

pytestmark = pytest.mark.torch

# /proc/net/tcp writes IPv4 127.0.0.1 as 0100007F and IPv6 ::1 as 0...01000000.
LOOPBACK = {"0100007F", "00000000000000000000000001000000"}


def _listening_addresses() -> list[str]:
    """Hex local addresses of this process's listening TCP sockets (Linux ``/proc``)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with open(table) as f:
            rows = [line.split() for line in f.readlines()[1:]]
        found += [row[1].split(":")[0] for row in rows if row[3] == "0A" and row[9] in inodes]
    return found


class Sockets(Actor):
    @endpoint
    def report(self) -> tuple[str | None, str | None, str | None, list[str]]:
        """gloo's interface, the one this proc's mesh uses, the address it advertises,
        and the addresses it listens on."""
        rt = this_node(start=False).runtime
        advertised = rt.tcp_advertise if rt is not None else None
        return (
            os.environ.get("GLOO_SOCKET_IFNAME"),
            mesh_interface(advertised),
            advertised,
            _listening_addresses(),
        )


def _hex(ip: str) -> str:
    """An IPv4 address as /proc/net/tcp writes it (little-endian hex)."""
    return socket.inet_aton(ip)[::-1].hex().upper()


def test_gloo_listens_only_on_the_interface_its_mesh_uses(mesh: ProcMesh) -> None:
    with mesh.activate():
        total = base(mesh).reduce(("host", "gpu"), "sum")  # gloo groups come up
        danaus.inspect(total)
    reports = mesh.spawn("sockets", Sockets).report.call().get(timeout=REPLY_TIMEOUT)
    for _, (iface, used, advertised, addresses) in reports.items():
        assert iface == used  # told to gloo before its first group
        if advertised is None or advertised.startswith("127."):
            assert iface == "lo"
            assert set(addresses) <= LOOPBACK, addresses
        else:  # reachable from other hosts: that address, and loopback, never all of them
            assert set(addresses) <= LOOPBACK | {_hex(advertised)}, addresses
