"""The data plane's wire (``net.py`` describes it): request and response records,
the errors a requester sees, and payloads sent and received in chunks, each sealed
with the session's tag."""

from __future__ import annotations

import ctypes
import logging
import socket
import ssl
import struct
import threading
import time
from typing import Any

from .. import _config as config
from .._transport.auth import TAG, AuthError, Handshake, Session

log = logging.getLogger("danaus.rdma")

FETCH, STORE = 1, 2
_OK, _REFUSED, _TAMPERED = 0, 1, 2
_REQ = struct.Struct("<BQQQQQ")
_RESP = struct.Struct("<BI")

SPLIT_MIN = 8 << 20  # a copy at least this large is split across ``rdma_streams`` connections
PART_MIN = 4 << 20  # ... into parts of at least this many bytes
POOL_MAX = 16  # idle connections kept per owner
MAX_MESSAGE = 64 << 10  # the longest refusal message a requester reads
_DRAIN = 1 << 20
_REFUSAL = bytes(32)  # in place of the server's MAC: fails the client's check
CHUNK = 256 << 10  # payload bytes per tag: what a receiver stages before it copies
ALTERED = "tag check failed: the data was altered on the way"
_BATCH = 16  # chunks sealed, then sent in one system call


class Refused(Exception):
    """The owner refused a request (the buffer was dropped, ...); ``str`` says why."""


class Closed(ConnectionError):
    """The data connection ended in the middle of a request (EOF)."""


class Tampered(AuthError):
    """A tag check failed after the handshake: bytes were altered (or injected, dropped,
    reordered) on the way between the two ends. ``str`` starts with `ALTERED`.

    Not a wrong secret (the handshake had succeeded), and not a lost owner.
    ``at``: the offset in the payload of the chunk that failed (None: not a payload's).
    """

    at: int | None = None


class Unserved(Closed):
    """The owner closed a new data connection before its first byte: every data thread of
    its server was busy (``rdma_max_data_threads``), or its process is going away."""


def split(nbytes: int) -> list[tuple[int, int]]:
    """``(offset, length)`` parts of a copy: one, or up to ``rdma_streams`` for a large copy."""
    if nbytes < SPLIT_MIN:
        return [(0, nbytes)] if nbytes else []
    n = max(1, min(config.get("rdma_streams"), nbytes // PART_MIN))
    step = -(-nbytes // n)
    step = (step + 4095) & ~4095
    return [(off, min(step, nbytes - off)) for off in range(0, nbytes, step)]


def _view(addr: int, nbytes: int) -> memoryview:
    """A writable byte view of ``nbytes`` of this process's memory at ``addr`` (no copy).

    The caller keeps the object that owns the memory alive while it uses the view.
    """
    return memoryview((ctypes.c_char * nbytes).from_address(addr)).cast("B")


def _tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3)):
        opt = getattr(socket, name, None)
        if opt is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, opt, value)
            except OSError:  # pragma: no cover - a platform without it
                pass


def _send_all(sock: socket.socket, parts: list[Any]) -> None:
    """Send ``parts`` back to back, in as few system calls as the kernel allows."""
    views = [memoryview(p).cast("B") for p in parts if len(p)]
    if isinstance(sock, ssl.SSLSocket):  # no sendmsg on TLS
        for v in views:
            sock.sendall(v)
        return
    while views:
        sent = sock.sendmsg(views)
        while sent and views:
            if sent >= len(views[0]):
                sent -= len(views.pop(0))
            else:
                views[0] = views[0][sent:]
                sent = 0


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    _recv_into(sock, memoryview(buf))
    return bytes(buf)


def _recv_into(sock: socket.socket, view: memoryview) -> None:
    """Fill ``view`` from ``sock``; ``Closed`` on EOF before it is full."""
    got, n = 0, len(view)
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise Closed(f"the peer closed the data connection ({got} of {n} bytes received)")
        got += k


def _handshake(
    sock: socket.socket, secret: bytes | None, role: Any, deadline: float
) -> Session | None:
    """Run the job-secret handshake on a blocking socket (as the runtime's connections do),
    all of it before ``deadline`` (``time.monotonic()``); returns the session, if any.

    Raises ``TimeoutError`` past the deadline, `AuthError` on a wrong answer.
    """
    if secret is None:
        return None
    hs = Handshake(secret, role)
    first = hs.start()
    if first:
        sock.sendall(first)
    heard = False  # anything from the peer yet
    while not hs.done:
        buf = bytearray(hs.want())
        view, got = memoryview(buf), 0
        while got < len(buf):  # a byte at a time must not stretch the deadline
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the data connection's handshake took too long")
            sock.settimeout(left)
            k = sock.recv_into(view[got:])
            if k == 0:
                if role == "client" and not heard:
                    raise Unserved("the owner's data server closed the connection unserved")
                raise Closed("the peer closed the data connection during the handshake")
            got += k
            heard = True
        try:
            out = hs.feed(bytes(buf))
        except AuthError:
            if role == "server":
                # Say so instead of just closing: to the client, a bare EOF means that
                # the owner's process is gone, this means "wrong secret" (a bad MAC).
                sock.sendall(_REFUSAL)
            raise
        if out:
            sock.sendall(out)
    return hs.session()


def _seal(session: Session | None, parts: list[Any]) -> list[Any]:
    return parts if session is None else [*parts, session.seal(parts)]


def _verify(session: Session, head: Any, data: Any, tag: Any, what: str) -> None:
    """Check the tag of the next frame received; `Tampered` (naming ``what``) if not."""
    try:
        session.check(head, data, tag)
    except AuthError as e:
        raise Tampered(f"{ALTERED} ({what} did not match its tag)") from e


def _check(
    sock: socket.socket, session: Session | None, head: bytes, what: str = "a frame"
) -> None:
    """Read the tag that follows ``head`` and check it; `Tampered` if it does not match."""
    if session is not None:
        _verify(session, head, b"", _recv_exact(sock, TAG), what)


def _chunks(nbytes: int) -> int:
    return -(-nbytes // CHUNK)


def payload_size(nbytes: int, session: Session | None) -> int:
    """Bytes on the wire for a payload of ``nbytes`` (its tags included)."""
    return nbytes + (TAG * _chunks(nbytes) if session is not None else 0)


def _send_payload(
    sock: socket.socket, session: Session | None, head: list[Any], view: memoryview
) -> None:
    """Send ``head`` (sealed frames), then ``view`` as a payload: chunk by chunk, each with
    its tag (bare without a session), ``_BATCH`` chunks per system call."""
    if session is None:
        _send_all(sock, [*head, view])
        return
    parts = head
    for off in range(0, len(view), CHUNK):
        chunk = view[off : off + CHUNK]
        parts += [chunk, session.seal([chunk])]
        if len(parts) >= 2 * _BATCH:
            _send_all(sock, parts)
            parts = []
    _send_all(sock, parts)


# A per-thread cache, not state: each thread's staging buffer (see _scratch_buffer).
_scratch = threading.local()


def _scratch_buffer() -> memoryview:
    """This thread's staging buffer: one chunk and its tag (kept for the thread's life)."""
    buf = getattr(_scratch, "buf", None)
    if buf is None:
        buf = _scratch.buf = memoryview(bytearray(CHUNK + TAG))
    return buf


def _recv_payload(sock: socket.socket, session: Session | None, view: memoryview) -> None:
    """Receive a payload into ``view``; only verified bytes are ever written to it.

    With a session, each chunk and its tag land in a scratch buffer first and
    the chunk is copied into ``view`` once its tag matches; `Tampered`
    at the first chunk that does not (``.at``: its offset; the chunks before
    it are in ``view``, it and those after are not). Without one (TLS, or no
    secret), straight into ``view``.
    """
    if session is None:
        _recv_into(sock, view)
        return
    scratch = _scratch_buffer()
    n = len(view)
    for off in range(0, n, CHUNK):
        k = min(CHUNK, n - off)
        staged = scratch[: k + TAG]
        _recv_into(sock, staged)
        try:
            _verify(
                session, b"", staged[:k], staged[k:],
                f"payload bytes {off}..{off + k} of {n}, chunk {off // CHUNK}",
            )  # fmt: skip
        except Tampered as e:
            e.at = off
            raise
        view[off : off + k] = staged[:k]


def _close(sock: socket.socket) -> None:
    try:
        sock.close()
    except OSError:  # pragma: no cover
        pass
