"""The dashboard's front door: one thread reads request heads; only a tokened one gets a thread.

::

    browser / danaus top / anyone on the host
        |  TCP
        v
    Gate (one thread, a selector: no thread per connection)
        |  accept; read the request head (at most MAX_HEAD bytes,
        |  within dashboard_request_timeout, else closed)
        |  no or wrong token            -> 403, closed     (no thread spent)
        |  more than max_pending_handshakes heads unread -> the oldest is closed
        |  dashboard_max_connections handlers busy      -> 503, closed
        v
    handler thread (a BaseHTTPRequestHandler fed the bytes the gate already read)
        serves this request and the next ones on the connection;
        a connection idle for dashboard_request_timeout is closed

A connection costs a thread only once it has shown the token, so users who do
not hold it cannot exhaust the account's threads: they hold at most
``max_pending_handshakes`` sockets at once (the oldest is shed beyond it, as the
runtime's listeners shed the oldest pending handshake), each for at most
``dashboard_request_timeout``.
"""

from __future__ import annotations

import errno
import http.server
import io
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .. import _config as config

__all__ = ["MAX_HEAD", "Gate", "RequestHandler"]

log = logging.getLogger("danaus.dashboard")

MAX_HEAD = 65536  # bytes of request line and headers (http.server's own line limit)
ACCEPT_BACKOFF = 0.5  # seconds without accepting after running out of descriptors

# (request target, Authorization header) -> does the request carry the token?
Authorized = Callable[[str, str], bool]
# (connection, client address, the bytes already read) -> serve it (blocks)
Serve = Callable[[socket.socket, Any, bytes], None]


def canned(code: int, reason: str, body: bytes) -> bytes:
    """A whole small response that closes the connection."""
    head = (
        f"HTTP/1.1 {code} {reason}\r\nContent-Type: text/plain\r\n"
        f"Content-Length: {len(body)}\r\nCache-Control: no-store\r\n"
        "X-Content-Type-Options: nosniff\r\nReferrer-Policy: no-referrer\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode() + body


FORBIDDEN = canned(403, "Forbidden", b"forbidden: open the URL with its token\n")
BAD_REQUEST = canned(400, "Bad Request", b"bad request: not an HTTP request\n")
TOO_LARGE = canned(
    431, "Request Header Fields Too Large", f"request head over {MAX_HEAD} bytes\n".encode()
)
BUSY = canned(
    503,
    "Service Unavailable",
    b"busy: dashboard_max_connections requests are being served; close a page or raise it\n",
)


def target_and_authorization(head: bytes) -> tuple[str, str] | None:
    """The request target and Authorization header of a request head; None if malformed."""
    lines = head.decode("latin-1").splitlines()
    parts = lines[0].split() if lines else []
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        return None
    auth = ""
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep and name.strip().lower() == "authorization":
            auth = value.strip()
    return parts[1], auth


def _head_end(buf: bytearray) -> int:
    """Where the blank line ending the head is (-1: not yet)."""
    ends = [i for i in (buf.find(b"\r\n\r\n"), buf.find(b"\n\n")) if i >= 0]
    return min(ends) if ends else -1


@dataclass
class _Pending:
    """A connection whose request head is still being read."""

    addr: Any
    deadline: float
    buf: bytearray = field(default_factory=bytearray)


class Gate:
    """Listen on ``(host, port)``; hand each tokened request's connection to ``serve``
    on a thread of its own (at most ``dashboard_max_connections`` at once).

    ``close()`` stops accepting and closes the connections whose head is
    unread; handler threads end on their own (they are daemons).
    """

    def __init__(self, host: str, port: int, authorized: Authorized, serve: Serve) -> None:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        families = [info[0] for info in infos]
        family = socket.AF_INET if socket.AF_INET in families else families[0]
        self._lsock = socket.create_server((host, port), family=family, backlog=128)
        self._lsock.setblocking(False)
        self.address: tuple[Any, ...] = self._lsock.getsockname()
        self._authorized = authorized
        self._serve = serve
        self._slots = threading.BoundedSemaphore(config.get("dashboard_max_connections"))
        self._pending: dict[socket.socket, _Pending] = {}  # insertion order: arrival
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._lsock, selectors.EVENT_READ)
        self._sel.register(self._wake_r, selectors.EVENT_READ)
        self._accept_paused_until = 0.0
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="danaus-dashboard", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop accepting; close the connections whose head is unread. Blocks briefly."""
        if self._closed.is_set():
            return
        self._closed.set()
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if self._thread is not threading.current_thread():
            self._thread.join()

    # -- the gate's thread ---------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._closed.is_set():
                for key, _ in self._sel.select(self._next_wait()):
                    if key.fileobj is self._lsock:
                        self._accept()
                    elif key.fileobj is self._wake_r:
                        self._drain_wakeups()
                    else:
                        conn: socket.socket = key.fileobj  # type: ignore[assignment]
                        try:
                            self._read(conn)
                        except Exception:
                            log.exception("the dashboard failed reading a request head")
                            self._drop(conn)
                self._expire()
                self._resume_accepting()
        except Exception:
            log.exception("the dashboard's listener failed")
        finally:
            for conn in list(self._pending):
                self._drop(conn)
            self._sel.close()
            for s in (self._lsock, self._wake_r, self._wake_w):
                s.close()

    def _next_wait(self) -> float | None:
        times = [p.deadline for p in self._pending.values()]
        if self._accept_paused_until:
            times.append(self._accept_paused_until)
        return max(0.0, min(times) - time.monotonic()) if times else None

    def _drain_wakeups(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except OSError:
            pass

    def _accept(self) -> None:
        while True:
            try:
                conn, addr = self._lsock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    # Out of descriptors: stop accepting a while instead of spinning.
                    log.warning("dashboard: accept failed (%s); pausing %.1f s", e, ACCEPT_BACKOFF)
                    self._sel.unregister(self._lsock)
                    self._accept_paused_until = time.monotonic() + ACCEPT_BACKOFF
                return
            conn.setblocking(False)
            deadline = time.monotonic() + config.get("dashboard_request_timeout")
            self._pending[conn] = _Pending(addr, deadline)
            self._sel.register(conn, selectors.EVENT_READ)
            if len(self._pending) > config.get("max_pending_handshakes"):
                # Those without the token hold no more than this many sockets: the
                # oldest goes (a real request's head arrives at once, not later).
                self._drop(next(iter(self._pending)))

    def _resume_accepting(self) -> None:
        if self._accept_paused_until and time.monotonic() >= self._accept_paused_until:
            self._accept_paused_until = 0.0
            self._sel.register(self._lsock, selectors.EVENT_READ)

    def _expire(self) -> None:
        now = time.monotonic()
        for conn, p in list(self._pending.items()):
            if p.deadline <= now:
                self._drop(conn)  # no whole request within dashboard_request_timeout

    def _read(self, conn: socket.socket) -> None:
        p = self._pending.get(conn)
        if p is None:
            return  # shed or expired earlier in this round of events
        try:
            data = conn.recv(MAX_HEAD)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(conn)
            return
        p.buf += data
        if _head_end(p.buf) < 0:
            if len(p.buf) >= MAX_HEAD:
                self._drop(conn, TOO_LARGE)
            return
        parsed = target_and_authorization(bytes(p.buf[: _head_end(p.buf)]))
        if parsed is None:
            self._drop(conn, BAD_REQUEST)
        elif not self._authorized(*parsed):
            self._drop(conn, FORBIDDEN)
        elif not self._slots.acquire(blocking=False):
            self._drop(conn, BUSY)
        else:
            self._sel.unregister(conn)
            del self._pending[conn]
            conn.setblocking(True)
            try:
                threading.Thread(
                    target=self._handle,
                    args=(conn, p.addr, bytes(p.buf)),
                    name="danaus-dashboard-request",
                    daemon=True,
                ).start()
            except BaseException:
                self._slots.release()  # no thread holds it: the slot would be lost for good
                raise

    def _drop(self, conn: socket.socket, answer: bytes = b"") -> None:
        """Close a connection whose head is unread or refused (after a short answer)."""
        self._pending.pop(conn, None)
        try:
            self._sel.unregister(conn)
        except (KeyError, ValueError):
            pass
        if answer:
            try:
                conn.send(answer)  # small: fits the socket's buffer, or is lost
            except OSError:
                pass
        conn.close()

    # -- a handler thread ----------------------------------------------------------------

    def _handle(self, conn: socket.socket, addr: Any, head: bytes) -> None:
        try:
            self._serve(conn, addr, head)
        except Exception:
            log.exception("the dashboard failed serving %s", addr)
        finally:
            try:
                conn.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            conn.close()
            self._slots.release()


class _Replay(io.RawIOBase):
    """A connection's bytes: first those the gate already read, then the socket's."""

    def __init__(self, head: bytes, conn: socket.socket) -> None:
        self._head = memoryview(head)
        self._conn = conn

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        if self._head:
            n = min(len(b), len(self._head))
            b[:n] = self._head[:n]
            self._head = self._head[n:]
            return n
        return self._conn.recv_into(b)


class RequestHandler(http.server.BaseHTTPRequestHandler):
    """A ``BaseHTTPRequestHandler`` for a connection the gate let in.

    Construct it as ``cls(conn, addr, head)``: it serves the requests on the
    connection (the first one from ``head``) and returns when the connection
    closes or stays idle for ``dashboard_request_timeout``.
    """

    protocol_version = "HTTP/1.1"

    def __init__(self, conn: socket.socket, addr: Any, head: bytes) -> None:
        self._head = head
        super().__init__(conn, addr, None)  # type: ignore[arg-type]  # no socketserver

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(config.get("dashboard_request_timeout"))  # each read, write
        self.rfile.close()  # the makefile reader: replaced by one that replays the head
        self.rfile = io.BufferedReader(_Replay(self._head, self.connection))
