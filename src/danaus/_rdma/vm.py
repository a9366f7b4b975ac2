"""The one-sided copy primitives, shared with the transport (``danaus._transport.vm``)."""

from __future__ import annotations

from .._transport.vm import (
    CHUNK,
    address,
    allow_peers,
    available,
    copy,
    host_key,
    memmove,
    ptrace_scope,
)

__all__ = [
    "CHUNK",
    "address",
    "allow_peers",
    "available",
    "copy",
    "host_key",
    "memmove",
    "ptrace_scope",
]
