"""Network interfaces: which one carries an address, and which one a proc's mesh uses.

Libraries that open sockets of their own (UCX under NIXL, gloo, NCCL) listen on
every interface unless told otherwise. danaus tells them the interface its own
connections use: loopback for a proc that talks only to its own host (Unix
sockets), else the interface holding the address it advertises to other hosts.
Linux only (``SIOCGIFADDR``); elsewhere nothing is found and nothing is set.
"""

from __future__ import annotations

import fcntl
import socket
import struct

__all__ = ["interface_of", "mesh_interface"]

_SIOCGIFADDR = 0x8915


def interface_of(ip: str) -> str | None:
    """The name of the interface holding IPv4 address ``ip``, or None (never raises)."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return None
    for name in names:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                req = struct.pack("256s", name.encode()[:15])
                packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, req)
            except OSError:
                continue
        if socket.inet_ntoa(packed[20:24]) == ip:
            return name
    return None


def mesh_interface(advertised: str | None) -> str | None:
    """The interface a proc advertising ``advertised`` (None: Unix sockets only) is reached on.

    ``"lo"`` for a proc reached only on its own host or at a loopback address; the
    interface holding ``advertised`` otherwise; None when that is not an IPv4 address
    of this host (a name, IPv6), where the caller should leave the library's default.
    """
    if advertised is None or advertised.startswith("127."):
        return _loopback()
    return interface_of(advertised)


def _loopback() -> str | None:
    return interface_of("127.0.0.1") or "lo"
