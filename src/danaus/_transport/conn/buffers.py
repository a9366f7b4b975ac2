"""The byte views a connection writes: sizes, snapshots of what a caller may change
after ``send()`` returns, and the slices a partial write leaves."""

from __future__ import annotations

import collections
import socket
import ssl
from typing import Any

MAX_IOV = 512  # buffers in one sendmsg
# The send buffer asked for on a Unix socket (the kernel doubles it, up to twice
# net.core.wmem_max): with the default (~208 KiB) a 1 MiB frame goes out in five
# writes, each waiting for the reader to drain the last, the rest copied into the
# backlog for the I/O thread to write; with this one the sending thread hands it
# to the kernel in one sendmsg, straight from the caller's array.
UNIX_SNDBUF = 2 << 20
#: What a non-blocking socket raises when it cannot read or write now.
WOULD_BLOCK = (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError)


def set_unix_sndbuf(sock: socket.socket) -> int:
    """Give a Unix socket a send buffer of ``UNIX_SNDBUF`` where the kernel allows it
    (never smaller than it has already); returns the bytes one write surely hands to
    the kernel at once: half what the kernel granted (its accounting counts each
    buffer's overhead too), or 0 if unknown."""
    try:
        if sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) < 2 * UNIX_SNDBUF:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, UNIX_SNDBUF)
        return int(sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)) // 2
    except OSError:  # not allowed here: the kernel's default stays, which works too
        return 0


def total_bytes(parts: list[Any]) -> int:
    n = 0
    for p in parts:
        n += len(p) if type(p) is bytes else memoryview(p).nbytes
    return n


def snapshot(parts: list[Any]) -> list[memoryview]:
    """``owned_views(as_views(parts))``, with no cast or copy for ``bytes`` parts."""
    out = []
    for p in parts:
        if type(p) is bytes:
            out.append(memoryview(p))
        else:
            v = memoryview(p).cast("B")
            out.append(v if isinstance(v.obj, bytes) else memoryview(bytes(v)))
    return out


def as_views(parts: list[Any]) -> list[memoryview]:
    return [memoryview(p).cast("B") for p in parts]


def owned_views(views: list[memoryview]) -> list[memoryview]:
    """``views`` that will be written after ``send()`` returns, as a snapshot.

    The caller may change an array it sent as soon as ``send()`` returns
    (Monarch pickles at call time), so bytes not yet written are copied once
    here, unless they are immutable ``bytes`` already. A frame written at once
    (the common case) is never copied.
    """
    return [v if isinstance(v.obj, bytes) else memoryview(bytes(v)) for v in views]


def view_bytes(views: list[memoryview]) -> int:
    return sum(v.nbytes for v in views)


def skip_bytes(views: list[memoryview], n: int) -> list[memoryview]:
    out = []
    for v in views:
        if n >= len(v):
            n -= len(v)
            continue
        out.append(v[n:] if n else v)
        n = 0
    return out


def take_views(dq: collections.deque[memoryview], k: int) -> list[memoryview]:
    out = []
    for v in dq:
        out.append(v)
        if len(out) == k:
            break
    return out
