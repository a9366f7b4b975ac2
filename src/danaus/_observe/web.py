"""Every HTTP endpoint danaus serves, on one aiohttp event loop: one token, one set of limits.

::

    browser / danaus top / Prometheus / anyone on the host
        |  TCP (127.0.0.1 unless told otherwise)
        v
    HttpServer (aiohttp's low-level server on the process's one HTTP loop thread;
        |       no thread per connection, whatever its state)
        |  a connection that has not yet sent a tokened request is *pending*:
        |    at most max_pending_handshakes of them (beyond it the oldest is closed),
        |    each for at most dashboard_request_timeout (then closed)
        |  request without the token (query token=T or Authorization: Bearer T)
        |                                  -> 401 (none given) or 403 (wrong), closed
        |  tokened, but dashboard_max_connections admitted already -> 503, closed
        v
    admitted connection: its requests go to the route's coroutine; idle for
        dashboard_request_timeout between requests, or not reading an answer
        for as long, it is closed
        |  blocking work (asking the procs, DuckDB) -> a small shared pool of
        v  BLOCKING_WORKERS threads, never one per connection

The dashboard (``dashboard.py``) and ``serve_metrics`` (``prom.py``) are routes
on an `HttpServer` each; they share the loop thread, the worker pool and
the rules above, so the limits are tested once (``tests/security/test_http.py``).
aiohttp is an optional extra (``danaus[dashboard]``, ``danaus[prometheus]``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hmac
import ipaddress
import logging
import os
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from .. import _config as config

__all__ = [
    "BLOCKING_WORKERS",
    "HttpServer",
    "Route",
    "Served",
    "aiohttp_web",
    "bind_addresses",
    "blocking",
    "carries_token",
    "url_host",
]

log = logging.getLogger("danaus.http")

T = TypeVar("T")
S = TypeVar("S", bound="Served")
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

BLOCKING_WORKERS = 4  # threads for blocking work of every HTTP endpoint of the process
MAX_LINE = 8190  # bytes of the request line and of one header (aiohttp's default)
MAX_BODY = 64 * 1024  # the endpoints take GETs: a body is never needed
SECURITY_HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}

# (request) -> the answer; a route of an HttpServer
Route = Callable[[Any], Awaitable[Any]]


def aiohttp_web() -> Any:
    """``aiohttp.web``, or an ``ImportError`` that says which extra installs it."""
    try:
        from aiohttp import web
    except ImportError:
        raise ImportError(
            "danaus's HTTP endpoints (the dashboard, serve_metrics) need aiohttp: "
            "pip install 'danaus[dashboard]' or 'danaus[prometheus]'"
        ) from None
    return web


# -- the process's one HTTP loop --------------------------------------------------------


class _LoopThread:
    """An asyncio loop on a daemon thread of its own, and the pool for blocking work."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self.pool = concurrent.futures.ThreadPoolExecutor(
            BLOCKING_WORKERS, thread_name_prefix="danaus-http-work"
        )
        ready = threading.Event()
        self.thread = threading.Thread(
            target=self._run, args=(ready,), name="danaus-http", daemon=True
        )
        self.thread.start()
        ready.wait()

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(ready.set)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and wait for its result (from any other thread)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()


# A cache, per process, like the threads it replaces: the loop serves every endpoint of
# the process and keeps no state of its own between them. _LOCK guards making it; a
# forked child (pid differs) makes its own, since the parent's thread is not in it.
_LOOP: _LoopThread | None = None
_LOCK = threading.Lock()


def _loop_thread() -> _LoopThread:
    global _LOOP
    with _LOCK:
        if _LOOP is None or _LOOP.pid != os.getpid():
            _LOOP = _LoopThread()
        return _LOOP


async def blocking(fn: Callable[..., T], *args: Any) -> T:
    """Run blocking ``fn(*args)`` on the shared pool of ``BLOCKING_WORKERS`` threads."""
    return await asyncio.get_running_loop().run_in_executor(_loop_thread().pool, fn, *args)


def carries_token(request: Any, token: str) -> bool:
    """Whether ``request`` carries ``token`` (query ``token=`` or ``Authorization: Bearer``),
    compared in constant time."""
    given = request.query.get("token", "")
    auth = request.headers.get("Authorization", "")
    if not given and auth.startswith("Bearer "):
        given = auth[len("Bearer ") :]
    return hmac.compare_digest(given.encode(), token.encode())


# -- connections ------------------------------------------------------------------------


@dataclass
class _Conn:
    """One connection: pending until its first tokened request, then admitted."""

    handler: Any  # aiohttp's RequestHandler (the connection's protocol)
    transport: Any
    deadline: asyncio.TimerHandle | None = None  # pending: closed when it fires
    admitted: bool = False
    stuck_since: float | None = None  # an answer waits unread since then
    stuck_size: int = 0


def _text(web: Any, code: int, body: str, *, close: bool = False, **headers: str) -> Any:
    resp = web.Response(
        status=code, text=body, content_type="text/plain", headers={**SECURITY_HEADERS, **headers}
    )
    if close:
        resp.force_close()
    return resp


class Served:
    """What a caller holds of a running server (the dashboard, ``/metrics``): ``url`` and
    ``stop()``; a context manager that stops it at the end of the block."""

    url: str

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self: S) -> S:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


class HttpServer:
    """Serve ``routes`` (path -> coroutine of the request) on ``(host, port)`` to requests
    carrying ``token``, on the process's HTTP loop. ``address`` is where it listens;
    ``stop()`` closes it and every connection. Raises ``OSError`` if the address cannot be
    bound, ``ImportError`` without aiohttp."""

    def __init__(
        self, host: str, port: int, token: str, routes: dict[str, Route], *, name: str
    ) -> None:
        web = aiohttp_web()
        self._web = web
        self.token = token
        self.name = name
        self._routes = routes
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        families = [info[0] for info in infos]
        family = socket.AF_INET if socket.AF_INET in families else families[0]
        self._lsock = socket.create_server((host, port), family=family, backlog=128)
        self._lsock.setblocking(False)
        self.address: tuple[Any, ...] = self._lsock.getsockname()
        self._loop = _loop_thread()
        self._conns: OrderedDict[Any, _Conn] = OrderedDict()  # aiohttp's handler -> conn
        self._stopped = False
        try:
            self._loop.run(self._start())
        except BaseException:
            self._lsock.close()
            raise

    # -- on the loop ---------------------------------------------------------------

    async def _start(self) -> None:
        web = self._web
        outer = self

        class _Server(web.Server):  # type: ignore[misc,name-defined]
            # aiohttp tells its server of each connection: the limits live here.
            def connection_made(self, handler: Any, transport: Any) -> None:
                super().connection_made(handler, transport)
                outer._opened(handler, transport)

            def connection_lost(self, handler: Any, exc: BaseException | None = None) -> None:
                outer._closed(handler)
                super().connection_lost(handler, exc)

        timeout = config.get("dashboard_request_timeout")
        self._server = _Server(
            self._handle,
            keepalive_timeout=timeout,  # an admitted connection idle between requests
            max_line_size=MAX_LINE,
            max_field_size=MAX_LINE,
            access_log=None,
            handler_cancellation=True,  # a client gone: its route's coroutine is cancelled
        )
        loop = asyncio.get_running_loop()
        self._listener = await loop.create_server(self._server, sock=self._lsock)
        self._sweeper = loop.create_task(self._sweep(timeout))

    def _opened(self, handler: Any, transport: Any) -> None:
        loop = asyncio.get_running_loop()
        conn = _Conn(handler, transport)
        conn.deadline = loop.call_later(
            config.get("dashboard_request_timeout"), self._expire, handler
        )
        self._conns[handler] = conn
        pending = [c for c in self._conns.values() if not c.admitted]
        if len(pending) > config.get("max_pending_handshakes"):
            # Those without the token hold no more than this many sockets: the oldest
            # goes (a real request arrives at once, not later).
            self._abort(pending[0])

    def _closed(self, handler: Any) -> None:
        conn = self._conns.pop(handler, None)
        if conn is not None and conn.deadline is not None:
            conn.deadline.cancel()

    def _expire(self, handler: Any) -> None:
        conn = self._conns.get(handler)
        if conn is not None and not conn.admitted:
            self._abort(conn)  # no tokened request within dashboard_request_timeout

    def _abort(self, conn: _Conn) -> None:
        self._conns.pop(conn.handler, None)
        if conn.deadline is not None:
            conn.deadline.cancel()
        conn.transport.abort()

    async def _sweep(self, timeout: float) -> None:
        """Close connections whose answer has waited unread for ``timeout`` (a client
        that stopped reading would otherwise hold its coroutine and buffers for good)."""
        while True:
            await asyncio.sleep(max(0.05, timeout / 4))
            now = time.monotonic()
            for conn in list(self._conns.values()):
                size = conn.transport.get_write_buffer_size()
                if size == 0 or (conn.stuck_since is not None and size < conn.stuck_size):
                    conn.stuck_since = None if size == 0 else now  # drained, or draining
                    conn.stuck_size = size
                elif conn.stuck_since is None:
                    conn.stuck_since, conn.stuck_size = now, size
                elif now - conn.stuck_since >= timeout:
                    log.debug("%s: closing a connection not reading its answer", self.name)
                    self._abort(conn)

    async def _handle(self, request: Any) -> Any:
        web = self._web
        conn = self._conns.get(request.protocol)
        if conn is None:  # shed or expired meanwhile
            return _text(web, 503, "busy: try again\n", close=True)
        if not carries_token(request, self.token):
            # None given: 401 (RFC 9110: the client may authenticate); a wrong one: 403.
            given = "token" in request.query or "Authorization" in request.headers
            return _text(
                web,
                403 if given else 401,
                "forbidden: wrong token\n"
                if given
                else "unauthorized: send the token (URL token=... or Authorization: Bearer ...)\n",
                close=True,
                **{"WWW-Authenticate": 'Bearer realm="danaus"'},
            )
        if not conn.admitted:
            admitted = sum(1 for c in self._conns.values() if c.admitted)
            if admitted >= config.get("dashboard_max_connections"):
                return _text(
                    web,
                    503,
                    f"busy: dashboard_max_connections ({admitted}) connections are open to "
                    f"this {self.name}; close one or raise DANAUS_DASHBOARD_MAX_CONNECTIONS\n",
                    close=True,
                )
            conn.admitted = True
            if conn.deadline is not None:
                conn.deadline.cancel()
                conn.deadline = None
        if request.method not in ("GET", "HEAD"):
            return _text(web, 405, f"method {request.method} not allowed: use GET\n")
        route = self._routes.get(request.path)
        if route is None:
            return _text(web, 404, f"no such path {request.path!r} on this {self.name}\n")
        try:
            return await route(request)
        except (ConnectionResetError, asyncio.CancelledError):
            raise
        except Exception as e:  # say why rather than drop the connection
            log.exception("%s: %s failed", self.name, request.path)
            return _text(web, 500, f"{request.path} failed: {e}\n")

    async def _stop(self) -> None:
        self._sweeper.cancel()
        self._listener.close()
        for conn in list(self._conns.values()):
            self._abort(conn)
        await self._server.shutdown(1.0)
        await self._listener.wait_closed()

    # -- from any thread -----------------------------------------------------------

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the loop soon (thread-safe); nothing once stopped."""
        if not self._stopped:
            try:
                self._loop.loop.call_soon_threadsafe(fn, *args)
            except RuntimeError:  # the loop is closed (interpreter exit)
                pass

    def stop(self) -> None:
        """Stop listening and close every connection. Idempotent; blocks briefly."""
        if self._stopped:
            return
        self._stopped = True
        if threading.current_thread() is self._loop.thread:
            self._loop.loop.create_task(self._stop())
        else:
            self._loop.run(self._stop())

    def connections(self) -> tuple[int, int]:
        """(pending, admitted) connections now: for tests and ``statistics``."""
        conns = list(self._conns.values())
        admitted = sum(1 for c in conns if c.admitted)
        return len(conns) - admitted, admitted


def bind_addresses(host: str) -> list[IPAddress] | None:
    """The addresses a server binding to ``host`` listens on (``None``: ``host`` does not
    resolve, and binding will fail and say why)."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError:
        return None
    return [ipaddress.ip_address(str(i[4][0]).split("%")[0]) for i in infos]


def url_host(host: str) -> str:
    """``host`` as it goes in a URL (an IPv6 address in brackets)."""
    return f"[{host}]" if ":" in host else host
