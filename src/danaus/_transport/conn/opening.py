"""How a connection opens: TLS's handshake, then the secret's inside it, before any
frame is decoded or sent (I/O thread)."""

from __future__ import annotations

import errno
import ssl
from collections.abc import Callable

from ..._errors import PeerBrokenError
from ..auth import Handshake, Session
from .buffers import WOULD_BLOCK
from .core import ConnCore


class Opening:
    """The handshakes of one connection in progress: whether TLS's is still going
    (``tls_pending``), the secret's (``hs``, None once done or when there is none) and
    the bytes of its next message read so far. ``opened(session)`` runs once both are
    done (``session``: the secret's keys, None with TLS or without a secret; the flag:
    whether there was a secret's handshake), then ``on_authenticated()`` if there was;
    the connection forgets this object in ``opened``."""

    __slots__ = ("_buf", "_conn", "_on_authenticated", "_opened", "hs", "tls_pending")

    def __init__(
        self,
        conn: ConnCore,
        hs: Handshake | None,
        opened: Callable[[Session | None, bool], None],
        on_authenticated: Callable[[], None] | None,
        *,
        tls_pending: bool,
    ) -> None:
        self._conn = conn
        self._opened = opened
        self._on_authenticated = on_authenticated
        self.tls_pending = tls_pending
        self.hs = hs
        self._buf = b""

    def begin(self) -> None:
        """Start (I/O thread): TLS's handshake first when there is one."""
        if self.tls_pending:
            self._conn.loop.call_soon(self.tls_step)
        else:
            self._start_handshake()

    def on_readable(self) -> bool:
        """The socket is readable while opening: True while the read was the opening's."""
        if self.tls_pending:
            self.tls_step()
            return True
        return self.hs is not None and self._on_handshake_bytes()

    def deadline(self, timeout: float) -> None:
        if self.hs is not None and not self._conn.closed:
            self._conn._fail(PeerBrokenError(f"no handshake within {timeout} s"), cause=None)

    def _start_handshake(self) -> None:
        if self.hs is not None:
            first = self.hs.start()
            if first:
                self._raw_send(first)
        else:
            self._opened(None, False)

    def tls_step(self) -> None:
        """Advance the TLS handshake (I/O thread)."""
        conn = self._conn
        if conn.closed or not self.tls_pending:
            return
        try:
            conn.sock.do_handshake()  # type: ignore[attr-defined]
        except ssl.SSLWantReadError:
            self._tls_writer(False)
            return
        except ssl.SSLWantWriteError:
            self._tls_writer(True)
            return
        except OSError as e:
            if e.errno in (errno.ENOTCONN, errno.EAGAIN):  # the TCP connect is in progress
                self._tls_writer(True)
                return
            conn._fail(PeerBrokenError(f"TLS handshake failed: {e}"), cause=e)
            return
        self.tls_pending = False
        self._tls_writer(False)
        self._start_handshake()

    def _tls_writer(self, on: bool) -> None:
        conn = self._conn
        if on:
            conn.loop.add_writer(conn.fd, self.tls_step)
        else:
            conn.loop.remove_writer(conn.fd)

    def _raw_send(self, data: bytes) -> None:
        try:
            self._conn.sock.send(data)  # a few dozen bytes into a fresh socket: fits
        except OSError as e:
            self._conn._fail(PeerBrokenError(f"handshake write failed: {e}"), cause=e)

    def _on_handshake_bytes(self) -> bool:
        """Advance the secret's handshake; True while it is still in progress."""
        hs = self.hs
        conn = self._conn
        assert hs is not None
        try:
            chunk = conn.sock.recv(hs.want() - len(self._buf))
        except WOULD_BLOCK:
            return True
        except OSError as e:
            conn._fail(PeerBrokenError(f"read failed during handshake: {e}"), cause=e)
            return True
        if not chunk:
            conn._fail(PeerBrokenError("connection closed during the handshake"), cause=None)
            return True
        conn.last_recv = conn.loop.time()
        self._buf += chunk
        if len(self._buf) < hs.want():
            return True
        data, self._buf = self._buf, b""
        try:
            out = hs.feed(data)
        except PeerBrokenError as e:
            conn._fail(e, cause=None)
            return True
        if out:
            self._raw_send(out)
        if not hs.done:
            return True
        self.hs = None
        self._opened(None if conn.tls else hs.session(), True)  # TLS protects every byte
        if self._on_authenticated is not None:
            self._on_authenticated()
        return False
