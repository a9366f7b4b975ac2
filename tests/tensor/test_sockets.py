"""The sockets gloo opens for the tensor engine stay on the interface the mesh uses."""

from __future__ import annotations

import os

import pytest

import danaus
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
    def report(self) -> tuple[str | None, list[str]]:
        return os.environ.get("GLOO_SOCKET_IFNAME"), _listening_addresses()


def test_gloo_listens_only_on_the_loopback_interface_of_a_one_host_mesh(
    mesh: ProcMesh,
) -> None:
    with mesh.activate():
        total = base(mesh).reduce(("host", "gpu"), "sum")  # gloo groups come up
        danaus.inspect(total)
    reports = mesh.spawn("sockets", Sockets).report.call().get(timeout=REPLY_TIMEOUT)
    for _, (iface, addresses) in reports.items():
        assert iface == "lo"  # told to gloo before its first group
        assert set(addresses) <= LOOPBACK, addresses
