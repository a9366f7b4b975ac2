"""The web dashboard: a small HTTP server in the client, with a JSON API and live updates.

::

    browser / danaus top / danaus stack
        |  GET /?token=T                  the page (static HTML + JS)
        |  GET /api/state?token=T         the whole state, once (JSON)
        |  GET /api/events?token=T        the state again every dashboard_interval
        |                                 (server-sent events, one JSON document each)
        |  GET /api/stack?token=T&proc=P  a stack dump of proc P (or mesh=M&coords=C)
        |  GET /api/query?token=T&sql=Q   danaus.telemetry.query(Q): columns and rows
        |  GET /metrics (Bearer T)        the mesh's metrics in Prometheus's text format
        v
    Gate (on 127.0.0.1: one thread reads every request head; see gate.py)
        |  no token: 403 and closed, no thread spent
        v
    Dashboard (a thread per tokened connection, at most dashboard_max_connections)
        |  one poller thread: StateCollector.collect() every interval, shared by all
        v
    STATS frames to every proc (answered by their I/O threads)

Every request must carry the token (query ``token=`` or ``Authorization:
Bearer``), compared in constant time; anything else gets 403 and nothing
else. The server binds to 127.0.0.1 unless told otherwise; every interface
(``0.0.0.0``, ``::``) only with ``dashboard_all_interfaces``. It uses only the
standard library. While it runs, ``<job dir>/dashboard.json`` (mode 0600, in
the user's private directory) says where it is, so ``danaus top`` and
``danaus stack`` on this machine find it without being told.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import os
import secrets
import socket
import sys
import threading
import urllib.parse
from collections.abc import Callable
from importlib import resources
from typing import Any

from .. import _config as config
from .._actor.api import stats
from .._runtime.hosting import host
from .gate import Gate, RequestHandler
from .prom import CONTENT_TYPE, exposition
from .sql import QueryError
from .sql import query as run_query
from .state import StateCollector, discover, find_procs

__all__ = ["Dashboard", "serve"]

log = logging.getLogger("danaus.dashboard")

DISCOVERY_FILE = "dashboard.json"
DEFAULT_HOST = "127.0.0.1"  # what an empty dashboard_host means


class Dashboard:
    """A running dashboard: ``url`` (with its token), ``stop()``."""

    def __init__(
        self, host_: str, port: int, token: str | None = None, *, all_interfaces: bool = False
    ) -> None:
        host_ = host_.strip() or DEFAULT_HOST  # empty: the default, not every interface
        _check_interface(host_, all_interfaces)
        self.token = token or secrets.token_urlsafe(24)
        self.collector = StateCollector()
        # Guards _latest and _version; notified on each new document and on stop.
        self._cond = threading.Condition()
        self._latest: dict[str, Any] | None = None
        self._version = 0
        self._stopped = threading.Event()
        self._subscribers = 0
        handler = _make_handler(self)
        self._gate = Gate(host_, port, self._carries_token, handler)
        addr = self._gate.address
        self.host, self.port = str(addr[0]), int(addr[1])
        shown = f"[{self.host}]" if ":" in str(self.host) else self.host
        self.url = f"http://{shown}:{self.port}/?token={self.token}"
        if _every_interface(host_):
            print(
                f"danaus dashboard: WARNING: dashboard_all_interfaces: listening on every "
                f"interface ({shown}:{self.port}); anyone who can reach this port can try the "
                "token, and it travels without TLS",
                file=sys.stderr,
                flush=True,
            )
        self._poller = threading.Thread(
            target=self._poll, name="danaus-dashboard-poll", daemon=True
        )
        self._poller.start()
        self._discovery = os.path.join(host.ensure_runtime().job_dir, DISCOVERY_FILE)
        fd = os.open(self._discovery, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"url": self.url, "pid": os.getpid()}, f)

    def _carries_token(self, target: str, authorization: str) -> bool:
        """Whether a request (its target and Authorization header) carries the token."""
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(target).query)
        given = query.get("token", [""])[0]
        if not given and authorization.startswith("Bearer "):
            given = authorization[len("Bearer ") :]
        return hmac.compare_digest(given.encode(), self.token.encode())

    # -- the state, shared by every open page -------------------------------------

    def state(self, fresh: bool = False) -> dict[str, Any]:
        """The latest state document (collected now if ``fresh`` or none yet)."""
        if fresh or self._latest is None:
            doc = self.collector.collect()
            self._publish(doc)
            return doc
        return self._latest

    def _publish(self, doc: dict[str, Any]) -> None:
        with self._cond:
            self._latest = doc
            self._version += 1
            self._cond.notify_all()

    def _poll(self) -> None:
        while not self._stopped.wait(config.get("dashboard_interval")):
            if self._subscribers == 0:
                continue  # nobody watches: ask the procs nothing
            try:
                self._publish(self.collector.collect())
            except Exception:
                log.exception("collecting the dashboard's state failed")

    def wait_next(self, version: int, timeout: float) -> tuple[int, dict[str, Any] | None]:
        """Block until a state newer than ``version`` (or ``timeout``); (version, state)."""
        with self._cond:
            self._cond.wait_for(lambda: self._version > version or self._stopped.is_set(), timeout)
            return self._version, self._latest

    # -- lifecycle --------------------------------------------------------------

    def stop(self) -> None:
        """Stop serving (open event streams end). Idempotent; blocks briefly."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        with self._cond:
            self._cond.notify_all()
        self._gate.close()
        try:
            os.unlink(self._discovery)
        except OSError:
            pass

    def __enter__(self) -> Dashboard:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<Dashboard {self.url}>"


def serve(
    port: int | None = None, host: str | None = None, *, all_interfaces: bool | None = None
) -> Dashboard:
    """Serve the dashboard from this client; returns it (``.url`` holds the token).

    Binds to ``host`` (default: the ``dashboard_host`` setting; empty means
    127.0.0.1, this machine only) and ``port`` (default: the ``dashboard_port``
    setting; 0 = any free port). Every interface (``0.0.0.0``, ``::``) needs
    ``all_interfaces=True`` (default: the ``dashboard_all_interfaces`` setting,
    ``DANAUS_DASHBOARD_ALL_INTERFACES=1``) and prints a warning. Does not block:
    the server runs on daemon threads until ``stop()`` or the end of the
    program. Raises ``OSError`` if the port is taken, ``ValueError`` for a bad
    port or for every interface without the opt-in. Example::

        dash = danaus.dashboard.serve(port=8265)
        print(dash.url)   # http://127.0.0.1:8265/?token=...
    """
    if port is None:
        port = config.get("dashboard_port")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"port must be an int from 0 to 65535 (0: any free port), got {port!r}")
    if all_interfaces is None:
        all_interfaces = config.get("dashboard_all_interfaces")
    return Dashboard(host or config.get("dashboard_host"), port, all_interfaces=all_interfaces)


def _every_interface(host_: str) -> bool:
    """Whether binding to ``host_`` listens on every interface (0.0.0.0, ::, "0", ...)."""
    try:
        infos = socket.getaddrinfo(host_, None, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError:
        return False  # binding fails and says why
    return any(ipaddress.ip_address(str(i[4][0]).split("%")[0]).is_unspecified for i in infos)


def _check_interface(host_: str, all_interfaces: bool) -> None:
    if _every_interface(host_) and not all_interfaces:
        raise ValueError(
            f"refusing to serve the dashboard on {host_!r}: that is every network interface, "
            "so anyone who can reach this machine could try the token, which travels without "
            "TLS. Leave dashboard_host unset or empty (127.0.0.1: this machine only) or give "
            "one interface's address; to listen on every interface anyway, set "
            "DANAUS_DASHBOARD_ALL_INTERFACES=1 (or pass all_interfaces=True)"
        )


# -- HTTP ------------------------------------------------------------------------------


def _page() -> bytes:
    return resources.files("danaus._observe").joinpath("dashboard.html").read_bytes()


def _make_handler(dash: Dashboard) -> Callable[[socket.socket, Any, bytes], None]:
    class Handler(RequestHandler):
        server_version = "danaus-dashboard"

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("dashboard: " + format, *args)

        def _authorized(self) -> bool:
            # The gate checked the connection's first request; each later one is checked too.
            return dash._carries_token(self.path, self.headers.get("Authorization", ""))

        def _send(self, code: int, body: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.send_header("X-Content-Type-Options", "nosniff")
            self.send_header("Referrer-Policy", "no-referrer")
            self.end_headers()
            self.wfile.write(body)

        def _json(self, code: int, doc: Any) -> None:
            self._send(code, json.dumps(doc, default=str).encode(), "application/json")

        def do_GET(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            query = urllib.parse.parse_qs(url.query)
            if not self._authorized():
                self.close_connection = True
                self._send(403, b"forbidden: open the URL with its token\n", "text/plain")
                return
            try:
                if url.path in ("/", "/index.html"):
                    self._send(200, _page(), "text/html; charset=utf-8")
                elif url.path == "/api/state":
                    self._json(200, dash.state(fresh=True))
                elif url.path == "/api/events":
                    self._events()
                elif url.path == "/api/stack":
                    self._stack(query)
                elif url.path == "/api/query":
                    self._query(query)
                elif url.path == "/metrics":
                    self._metrics()
                else:
                    self._json(404, {"error": f"no such path {url.path!r}"})
            except (BrokenPipeError, ConnectionResetError):
                pass

        def _query(self, query: dict[str, list[str]]) -> None:
            sql = query.get("sql", [""])[0]
            try:
                rows = run_query(sql)
            except (QueryError, ImportError) as e:
                self._json(400, {"error": str(e)})
                return
            columns = list(rows[0]) if rows else []
            self._json(200, {"columns": columns, "rows": [list(r.values()) for r in rows]})

        def _metrics(self) -> None:
            try:
                body = exposition()
            except ImportError as e:
                self._send(501, f"{e}\n".encode(), "text/plain")
                return
            self._send(200, body, CONTENT_TYPE)

        def _events(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-store")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            dash._subscribers += 1
            try:
                doc: dict[str, Any] | None = dash.state()
                version = dash._version
                while not dash._stopped.is_set():
                    if doc is not None:
                        data = json.dumps(doc, default=str)
                        self.wfile.write(f"data: {data}\n\n".encode())
                        self.wfile.flush()
                    version, doc = dash.wait_next(version, 15.0)
                    if doc is None:
                        self.wfile.write(b": keep-alive\n\n")
                        self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError, OSError):
                pass
            finally:
                dash._subscribers -= 1

        def _stack(self, query: dict[str, list[str]]) -> None:
            try:
                procs = _stack_targets(query)
            except ValueError as e:
                self._json(400, {"error": str(e)})
                return
            answers = stats.ask_stacks(procs).result()
            self._json(
                200,
                {
                    "dumps": [
                        {"proc": p.name, "ok": ok, "dump": text}
                        for p, (ok, text) in zip(procs, answers, strict=True)
                    ]
                },
            )

    def serve(conn: socket.socket, addr: Any, head: bytes) -> None:
        Handler(conn, addr, head)

    return serve


def _stack_targets(query: dict[str, list[str]]) -> list[Any]:
    rt = host.ensure_runtime()
    if "proc" in query:
        names = set(query["proc"])
        out = []
        for entry in _all_procs():
            if entry.name in names:
                out.append(entry)
        if rt.proc_id.name in names:
            out.append(rt.proc_id)
        missing = names - {p.name for p in out}
        if missing:
            raise ValueError(f"no proc {sorted(missing)} in this client")
        return out
    if "mesh" in query:
        return find_procs(query["mesh"][0], parse_coords(query.get("coords", [""])[0]))
    raise ValueError("say which procs: proc=NAME, or mesh=NAME with optional coords=dim=i,...")


def _all_procs() -> list[Any]:
    """Every proc of the client's tree, those its actors spawned included."""
    return [e["id"] for e in discover()]


def parse_coords(text: str) -> dict[str, int] | list[int] | None:
    """``"gpus=1,hosts=0"`` -> dict, ``"0,1"`` -> list, ``""`` -> None. ``ValueError`` else."""
    text = text.strip()
    if not text:
        return None
    parts = [p.strip() for p in text.replace(" ", ",").split(",") if p.strip()]
    try:
        if all("=" in p for p in parts):
            return {k.strip(): int(v) for k, v in (p.split("=", 1) for p in parts)}
        if not any("=" in p for p in parts):
            return [int(p) for p in parts]
    except ValueError:
        pass
    raise ValueError(
        f"coordinates {text!r} are neither all named (gpus=1,hosts=0) nor all positional (0,1)"
    )


class FromEnvironment:
    """The dashboard ``DANAUS_DASHBOARD=1`` started on this node, if any
    (``node.part(FromEnvironment)``); stopped when the node ends, so the client's
    next session starts one of its own."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # guards dashboard
        self.dashboard: Dashboard | None = None

    def on_node_end(self) -> None:
        with self.lock:
            dash, self.dashboard = self.dashboard, None
        if dash is not None:
            dash.stop()


def serve_from_environment() -> Dashboard | None:
    """Start the dashboard once if the ``dashboard`` setting (``DANAUS_DASHBOARD=1``) is on."""
    if not config.get("dashboard"):
        return None
    part = host.ensure_node().part(FromEnvironment)
    with part.lock:
        if part.dashboard is None:
            part.dashboard = serve()
            print(f"danaus dashboard: {part.dashboard.url}", file=sys.stderr, flush=True)
        return part.dashboard
