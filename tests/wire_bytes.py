"""Reading raw bytes off a socket, for the tests that speak the wire protocol by hand
(attacks on listeners, handshakes, frames). One copy, imported by each."""

from __future__ import annotations

import socket


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    """Exactly ``n`` bytes from ``sock``; ``EOFError`` if it closes first."""
    got = b""
    while len(got) < n:
        chunk = sock.recv(n - len(got))
        if not chunk:
            raise EOFError(f"closed after {len(got)} of {n} bytes")
        got += chunk
    return got
