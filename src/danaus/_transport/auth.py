"""Mutual challenge-response authentication of a connection, before any frame.

Both ends prove they know the job secret without sending it (HMAC-SHA256
over fresh random nonces), so no frame from an unauthenticated peer is ever
decoded, let alone unpickled::

    server -> client   MAGIC | nonce_s                          (36 bytes)
    client -> server   HMAC(secret, "c" | nonce_s) | nonce_c    (64 bytes)
    server -> client   HMAC(secret, "s" | nonce_c)              (32 bytes)

A wrong answer, a wrong magic or a peer that never finishes (the caller
bounds the time) closes the connection.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets as _secrets
from typing import Literal

from .._errors import PeerBrokenError

__all__ = ["AuthError", "Handshake", "load_secret", "new_secret"]

MAGIC = b"DNS1"
_NONCE = 32
_MAC = 32


class AuthError(PeerBrokenError):
    """The peer failed to prove it knows the job secret."""


def new_secret() -> str:
    """A fresh random job secret (hex)."""
    return _secrets.token_hex(32)


def load_secret(secret: str | bytes | None = None, secret_file: str | None = None) -> bytes | None:
    """The job secret: the argument, else ``secret_file``, else ``$DANAUS_SECRET``, else None."""
    if secret is None and secret_file is not None:
        with open(secret_file, "rb") as f:
            secret = f.read().strip()
    if secret is None:
        secret = os.environ.get("DANAUS_SECRET") or None
    if secret is None:
        return None
    raw = secret.encode() if isinstance(secret, str) else bytes(secret)
    if len(raw) < 16:
        raise ValueError(
            f"the job secret must be at least 16 bytes long (got {len(raw)}); use e.g. "
            "python -c 'import secrets; print(secrets.token_hex(32))'"
        )
    return raw


def _mac(secret: bytes, tag: bytes, nonce: bytes) -> bytes:
    return hmac.new(secret, tag + nonce, hashlib.sha256).digest()


class Handshake:
    """One side of the handshake, as a byte-level state machine (no I/O)."""

    def __init__(self, secret: bytes, role: Literal["client", "server"]) -> None:
        self.secret = secret
        self.role = role
        self.done = False
        self._mine = _secrets.token_bytes(_NONCE)
        self._state = "challenge" if role == "client" else "response"

    def start(self) -> bytes:
        """Bytes to send first (the server's challenge; nothing for the client)."""
        return MAGIC + self._mine if self.role == "server" else b""

    def want(self) -> int:
        """How many bytes the next step needs."""
        return {"challenge": len(MAGIC) + _NONCE, "response": _MAC + _NONCE, "confirm": _MAC}[
            self._state
        ]

    def feed(self, data: bytes) -> bytes:
        """Consume exactly ``want()`` bytes; return bytes to send. Raises :class:`AuthError`."""
        if len(data) != self.want():
            raise AuthError(f"handshake step of {len(data)} bytes, expected {self.want()}")
        if self._state == "challenge":
            if data[: len(MAGIC)] != MAGIC:
                raise AuthError("the peer is not a danaus endpoint (bad handshake magic)")
            theirs = data[len(MAGIC) :]
            self._state = "confirm"
            return _mac(self.secret, b"c", theirs) + self._mine
        if self._state == "response":
            mac, theirs = data[:_MAC], data[_MAC:]
            if not hmac.compare_digest(mac, _mac(self.secret, b"c", self._mine)):
                raise AuthError("the peer does not know the job secret (bad HMAC)")
            self.done = True
            return _mac(self.secret, b"s", theirs)
        if not hmac.compare_digest(data, _mac(self.secret, b"s", self._mine)):
            raise AuthError("the server does not know the job secret (bad HMAC)")
        self.done = True
        return b""
