"""What a connection's parts use of the connection that holds them (a Protocol, so the
parts' modules import nothing of ``connection.py``, which imports them)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import Protocol

from .loop import clock_of
from .stats import ConnStats


class OpeningStep(Protocol):
    """The handshakes of a connection still opening (``opening.Opening``)."""

    def on_readable(self) -> bool:
        """Read what the handshakes wait for; True while the read was theirs."""
        ...


class ConnCore(Protocol):
    """The connection as its parts (``WriteBatcher``, ``FrameReader``, ``DirectReader``)
    see it: the socket and loop, whether it is TLS or closed, when it last heard from
    the peer, the handshake in progress, and the steps the parts hand back to it."""

    sock: socket.socket
    loop: asyncio.AbstractEventLoop
    fd: int
    tls: bool
    closed: bool
    close_exc: BaseException | None
    last_recv: float

    @property
    def opening(self) -> OpeningStep | None:
        """The handshakes in progress; None once the connection is open."""
        ...

    _on_readable: Callable[[], None]

    def _fail(self, exc: BaseException, cause: BaseException | None) -> None: ...

    def _release_socket(self) -> None: ...


class Part:
    """What each part of a connection keeps of it, read on every frame: the connection,
    its socket, loop, descriptor, whether it is TLS, the counters, and the loop's
    clock (``_now()``, what ``loop.time()`` returns)."""

    __slots__ = ("_conn", "_fd", "_loop", "_now", "_sock", "_stats", "_tls")

    def __init__(self, conn: ConnCore, stats: ConnStats) -> None:
        self._conn = conn
        self._sock = conn.sock
        self._loop = conn.loop
        self._fd = conn.fd
        self._tls = conn.tls
        self._stats = stats
        self._now = clock_of(conn.loop)
