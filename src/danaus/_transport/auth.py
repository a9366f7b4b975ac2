"""Mutual challenge-response authentication of a connection, before any frame.

Both ends prove they know the job secret without sending it (HMAC-SHA256
over fresh random nonces), so no frame from an unauthenticated peer is ever
decoded, let alone unpickled:

    server -> client   MAGIC | nonce_s                          (36 bytes)
    client -> server   HMAC(secret, "c" | nonce_s) | nonce_c    (64 bytes)
    server -> client   HMAC(secret, "s" | nonce_c)              (32 bytes)

A wrong answer, a wrong magic or a peer that never finishes (the caller
bounds the time) closes the connection.

The handshake alone would authenticate only itself: an on-path attacker could
relay it between two honest ends and then inject frames. So both ends derive
a `Session` from the secret and both nonces, one key per direction:

    prk      = HMAC(secret, "danaus-session-v1" | nonce_s | nonce_c)
    k_c2s    = HMAC(prk, "client->server")      k_s2c = HMAC(prk, "server->client")

and every frame after the handshake carries ``HMAC(k_dir, seq | frame)``
(``seq`` counts the frames of that direction), so a frame that was injected,
replayed, reordered, reflected back to its sender or spliced in from another
connection fails its check and closes the connection. See docs/security.md.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets as _secrets
from collections.abc import Iterable
from typing import TYPE_CHECKING, Literal

from .._errors import PeerBrokenError
from .owned import read_owned

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

__all__ = ["AuthError", "Handshake", "Session", "load_secret", "new_secret"]

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
        secret = _read_secret_file(secret_file)
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


def _read_secret_file(path: str) -> bytes:
    """The secret in ``path``, refused unless only its owner, this user, can read it."""
    return read_owned(path, "the secret file").strip()


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
        self._theirs = b""

    def start(self) -> bytes:
        """Bytes to send first (the server's challenge; nothing for the client)."""
        return MAGIC + self._mine if self.role == "server" else b""

    def want(self) -> int:
        """How many bytes the next step needs."""
        return {"challenge": len(MAGIC) + _NONCE, "response": _MAC + _NONCE, "confirm": _MAC}[
            self._state
        ]

    def feed(self, data: bytes) -> bytes:
        """Consume exactly ``want()`` bytes; return bytes to send. Raises `AuthError`."""
        if len(data) != self.want():
            raise AuthError(f"handshake step of {len(data)} bytes, expected {self.want()}")
        if self._state == "challenge":
            if data[: len(MAGIC)] != MAGIC:
                raise AuthError("the peer is not a danaus endpoint (bad handshake magic)")
            theirs = data[len(MAGIC) :]
            self._theirs = theirs
            self._state = "confirm"
            return _mac(self.secret, b"c", theirs) + self._mine
        if self._state == "response":
            mac, theirs = data[:_MAC], data[_MAC:]
            if not hmac.compare_digest(mac, _mac(self.secret, b"c", self._mine)):
                raise AuthError("the peer does not know the job secret (bad HMAC)")
            self._theirs = theirs
            self.done = True
            return _mac(self.secret, b"s", theirs)
        if not hmac.compare_digest(data, _mac(self.secret, b"s", self._mine)):
            raise AuthError("the server does not know the job secret (bad HMAC)")
        self.done = True
        return b""

    def session(self) -> Session:
        """The keys of this connection, bound to this handshake (once ``done``)."""
        if not self.done:
            raise RuntimeError("the handshake is not done: no session key yet")
        server_nonce, client_nonce = (
            (self._mine, self._theirs) if self.role == "server" else (self._theirs, self._mine)
        )
        prk = hmac.new(
            self.secret, b"danaus-session-v1" + server_nonce + client_nonce, hashlib.sha256
        ).digest()
        c2s = hmac.new(prk, b"client->server", hashlib.sha256).digest()
        s2c = hmac.new(prk, b"server->client", hashlib.sha256).digest()
        return Session(c2s, s2c) if self.role == "client" else Session(s2c, c2s)


TAG = 32  # bytes of HMAC-SHA256 after every frame of an authenticated connection


class Session:
    """Per-frame authentication of one connection: ``seal`` what we send, ``check`` what
    we receive. Not thread-safe: the caller orders the frames (the connection's lock)."""

    __slots__ = ("_recv", "_recv_seq", "_send", "_send_seq")

    def __init__(self, send_key: bytes, recv_key: bytes) -> None:
        # Keyed once; each frame copies the keyed state (cheaper than re-keying).
        self._send = hmac.new(send_key, digestmod=hashlib.sha256)
        self._recv = hmac.new(recv_key, digestmod=hashlib.sha256)
        self._send_seq = 0
        self._recv_seq = 0

    def seal(self, parts: Iterable[ReadableBuffer]) -> bytes:
        """The tag of the next frame we send (``parts``: its bytes, in order)."""
        m = self._send.copy()
        m.update(self._send_seq.to_bytes(8, "little"))
        for p in parts:
            m.update(p)
        self._send_seq += 1
        return m.digest()

    def check(self, prefix: bytes, frame: memoryview, tag: memoryview) -> None:
        """Verify the next frame received; `AuthError` if it was not sealed for us."""
        m = self._recv.copy()
        m.update(self._recv_seq.to_bytes(8, "little"))
        m.update(prefix)
        m.update(frame)
        if not hmac.compare_digest(m.digest(), bytes(tag)):
            raise AuthError(
                f"frame {self._recv_seq} failed its authentication check (injected, replayed "
                "or altered on the way): closing the connection"
            )
        self._recv_seq += 1

    def skip_recv(self) -> None:
        """Count a received frame whose bytes are discarded unread (keeps the sequence)."""
        self._recv_seq += 1
