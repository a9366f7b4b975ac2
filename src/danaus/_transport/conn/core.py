"""What a connection's parts use of the connection that holds them (a Protocol, so the
parts' modules import nothing of ``connection.py``, which imports them)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import Protocol

from ..auth import Handshake


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
    _tls_pending: bool
    _hs: Handshake | None
    _on_readable: Callable[[], None]

    def _tls_step(self) -> None: ...

    def _on_handshake_bytes(self) -> bool: ...

    def _fail(self, exc: BaseException, cause: BaseException | None) -> None: ...

    def _release_socket(self) -> None: ...
