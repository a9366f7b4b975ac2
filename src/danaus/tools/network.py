"""``danaus.tools.network``: Monarch's address lookup (``AddrType``, ``get_ipaddr``,
``get_sockaddr``): IPv6 first, then IPv4, skipping link-local addresses."""

from __future__ import annotations

from .._job.servers import AddrType, get_ipaddr, get_sockaddr

__all__ = ["AddrType", "get_ipaddr", "get_sockaddr"]

AddrType.__module__ = __name__
