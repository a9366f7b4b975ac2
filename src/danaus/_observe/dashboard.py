"""The web dashboard: a small HTTP server in the client, with a JSON API and live updates.

::

    browser / danaus top / danaus stack
        |  GET /?token=T                  the page (static HTML + JS)
        |  GET /api/state?token=T         the whole state, once (JSON)
        |  GET /api/events?token=T        the state again every dashboard_interval
        |                                 (server-sent events, one JSON document each)
        |  GET /api/stack?token=T&proc=P  a stack dump of proc P (or mesh=M&coords=C)
        |  GET /api/query?token=T&sql=Q   danaus.telemetry.query(Q): columns and rows
        |  GET /api/history?token=T&seconds=S  the endpoints' rates and mean latencies
        |                                 over the last S seconds, from the kept history
        |  GET /metrics (Bearer T)        the mesh's metrics in Prometheus's text format
        |  GET /ui?token=T, /api/ui/...   the pages: jobs, meshes, actors, timeline,
        |                                 logs, metrics (see ui/__init__.py)
        v
    HttpServer (on 127.0.0.1, on the process's one HTTP loop thread; see web.py)
        |  no token: 403 and closed; at most dashboard_max_connections tokened
        |  connections, idle ones closed; no thread per connection
        v
    Dashboard's routes (coroutines; blocking work on web.py's small shared pool)
        |  one poller thread: StateCollector.collect() every interval, shared by all
        v
    STATS frames to every proc (answered by their I/O threads)

Every request must carry the token (query ``token=`` or ``Authorization:
Bearer``), compared in constant time; anything else gets 403 and nothing
else. The server binds to 127.0.0.1 unless told otherwise; every interface
(``0.0.0.0``, ``::``) only with ``dashboard_all_interfaces``. It runs on
aiohttp (the ``dashboard`` extra), as every HTTP endpoint of danaus does. While
it runs, ``<job dir>/dashboard.json`` (mode 0600, in the user's private
directory) says where it is, so ``danaus top`` and ``danaus stack`` on this
machine find it without being told.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import sys
import threading
from importlib import resources
from typing import Any

from .. import _config as config
from .._actor.api import stats
from .._runtime.node import Node, this_node
from . import history
from .prom import CONTENT_TYPE, cached_exposition
from .sql import QueryError, query_on
from .state import StateCollector, discover, find_procs
from .ui import assemble as ui_assemble
from .ui import routes as ui_routes
from .web import (
    SECURITY_HEADERS,
    HttpServer,
    Route,
    Served,
    aiohttp_web,
    bind_addresses,
    blocking,
    url_host,
)

__all__ = ["Dashboard", "serve"]

log = logging.getLogger("danaus.dashboard")

DISCOVERY_FILE = "dashboard.json"
DEFAULT_HOST = "127.0.0.1"  # what an empty dashboard_host means


class Dashboard(Served):
    """A running dashboard: ``url`` (with its token), ``stop()``."""

    def __init__(
        self,
        node: Node,
        host_: str,
        port: int,
        token: str | None = None,
        *,
        all_interfaces: bool = False,
    ) -> None:
        host_ = host_.strip() or DEFAULT_HOST  # empty: the default, not every interface
        _check_interface(host_, all_interfaces)
        self.node = node  # the client it shows: its procs, its meshes, its job directory
        self.token = token or secrets.token_urlsafe(24)
        self.collector = StateCollector(node)
        # Guards _latest and _version; notified on each new document and on stop.
        self._cond = threading.Condition()
        self._latest: dict[str, Any] | None = None
        self._version = 0
        self._stopped = threading.Event()
        self._subscribers = 0  # open event streams (changed on the HTTP loop only)
        self._changed: asyncio.Event | None = None  # set on the HTTP loop at each new state
        self._server = HttpServer(host_, port, self.token, _routes(self), name="dashboard")
        addr = self._server.address
        self.host, self.port = str(addr[0]), int(addr[1])
        shown = url_host(self.host)
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
        self._discovery = os.path.join(node.runtime.job_dir, DISCOVERY_FILE)
        fd = os.open(self._discovery, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"url": self.url, "pid": os.getpid()}, f)

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
        self._server.call_soon(self._wake)

    def _wake(self) -> None:
        """On the HTTP loop: wake the event streams waiting for a new state."""
        changed, self._changed = self._changed, None
        if changed is not None:
            changed.set()

    async def next_state(self, version: int, timeout: float) -> tuple[int, dict[str, Any] | None]:
        """On the HTTP loop: wait for a state newer than ``version``; (version, state), or
        (version, None) after ``timeout`` seconds without one."""
        if self._version > version or self._stopped.is_set():
            return self._version, self._latest
        if self._changed is None:
            self._changed = asyncio.Event()
        try:
            await asyncio.wait_for(self._changed.wait(), timeout)
        except asyncio.TimeoutError:
            return version, None
        return self._version, self._latest

    def _poll(self) -> None:
        while not self._stopped.wait(config.get("dashboard_interval")):
            if self._subscribers == 0:
                continue  # nobody watches: ask the procs nothing
            try:
                self._publish(self.collector.collect())
            except Exception:
                log.exception("collecting the dashboard's state failed")

    # -- lifecycle --------------------------------------------------------------

    def stop(self) -> None:
        """Stop serving (open event streams end). Idempotent; blocks briefly."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        with self._cond:
            self._cond.notify_all()
        self._server.stop()
        try:
            os.unlink(self._discovery)
        except OSError:
            pass

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
    port or for every interface without the opt-in. Example:

        dash = danaus.dashboard.serve(port=8265)
        print(dash.url)   # http://127.0.0.1:8265/?token=...
    """
    return _serve(None, port, host, all_interfaces)


def _serve(
    node: Node | None,
    port: int | None = None,
    host: str | None = None,
    all_interfaces: bool | None = None,
) -> Dashboard:
    """`serve()` for ``node``'s client; None: the user's, looked up (started if need be)
    once the arguments are known to be good."""
    if port is None:
        port = config.get("dashboard_port")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"port must be an int from 0 to 65535 (0: any free port), got {port!r}")
    if all_interfaces is None:
        all_interfaces = config.get("dashboard_all_interfaces")
    host_ = host or config.get("dashboard_host")
    if node is None:
        _check_interface(host_.strip() or DEFAULT_HOST, all_interfaces)  # before any start
        node = this_node()  # the public face: ``danaus.dashboard.serve()`` holds nothing
    return Dashboard(node, host_, port, all_interfaces=all_interfaces)


def _every_interface(host_: str) -> bool:
    """Whether binding to ``host_`` listens on every interface (0.0.0.0, ::, "0", ...)."""
    addrs = bind_addresses(host_)
    return addrs is not None and any(a.is_unspecified for a in addrs)


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
    html = resources.files("danaus._observe").joinpath("dashboard.html").read_text("utf-8")
    return ui_assemble(html).encode()


def _routes(dash: Dashboard) -> dict[str, Route]:
    web = aiohttp_web()

    def answer(code: int, body: bytes, ctype: str) -> Any:
        return web.Response(
            status=code, body=body, headers={**SECURITY_HEADERS, "Content-Type": ctype}
        )

    def as_json(code: int, doc: Any) -> Any:
        return answer(code, json.dumps(doc, default=str).encode(), "application/json")

    async def page(request: Any) -> Any:
        return answer(200, _page(), "text/html; charset=utf-8")

    async def state(request: Any) -> Any:
        return as_json(200, await blocking(dash.state, True))

    async def query(request: Any) -> Any:
        sql = request.query.get("sql", "")
        try:
            rows = await blocking(query_on, dash.node, sql)
        except (QueryError, ImportError) as e:
            return as_json(400, {"error": str(e)})
        columns = list(rows[0]) if rows else []
        return as_json(200, {"columns": columns, "rows": [list(r.values()) for r in rows]})

    async def kept(request: Any) -> Any:
        raw = request.query.get("seconds", "3600")
        try:
            seconds = float(raw)
            if not 0 < seconds <= 30 * 86400:
                raise ValueError
        except ValueError:
            return as_json(400, {"error": f"seconds must be a number in (0, 2592000], got {raw!r}"})
        h = history.active()
        if h is None:  # no job's telemetry keeps history in this client
            return as_json(200, {"kept": False, "series": []})
        series = await blocking(h.series, seconds)
        return as_json(200, {"kept": True, "path": h.path, "series": series})

    async def metrics(request: Any) -> Any:
        try:
            body = await cached_exposition()
        except ImportError as e:
            return answer(501, f"{e}\n".encode(), "text/plain")
        return answer(200, body, CONTENT_TYPE)

    async def stack(request: Any) -> Any:
        q = {k: request.query.getall(k) for k in request.query}
        try:
            procs = await blocking(_stack_targets, dash.node, q)
        except ValueError as e:
            return as_json(400, {"error": str(e)})
        answers = await asyncio.wrap_future(stats.ask_stacks(dash.node.runtime, procs))
        return as_json(
            200,
            {
                "dumps": [
                    {"proc": p.name, "ok": ok, "dump": text}
                    for p, (ok, text) in zip(procs, answers, strict=True)
                ]
            },
        )

    async def events(request: Any) -> Any:
        resp = web.StreamResponse(
            status=200, headers={**SECURITY_HEADERS, "Content-Type": "text/event-stream"}
        )
        resp.force_close()  # the stream ends with the connection
        await resp.prepare(request)
        dash._subscribers += 1
        try:
            doc: dict[str, Any] | None = dash._latest
            if doc is None:
                doc = await blocking(dash.state)
            version = dash._version
            while not dash._stopped.is_set():
                if doc is not None:
                    await resp.write(f"data: {json.dumps(doc, default=str)}\n\n".encode())
                version, doc = await dash.next_state(version, 15.0)
                if doc is None:
                    await resp.write(b": keep-alive\n\n")
        except (ConnectionResetError, OSError):
            pass
        finally:
            dash._subscribers -= 1
        return resp

    return {
        **ui_routes(dash),  # the pages: jobs, meshes, actors, timeline, logs, metrics
        "/": page,
        "/index.html": page,
        "/api/state": state,
        "/api/events": events,
        "/api/stack": stack,
        "/api/query": query,
        "/api/history": kept,
        "/metrics": metrics,
    }


def _stack_targets(node: Node, query: dict[str, list[str]]) -> list[Any]:
    rt = node.runtime
    if "proc" in query:
        names = set(query["proc"])
        out = []
        for entry in _all_procs(node):
            if entry.name in names:
                out.append(entry)
        if rt.proc_id.name in names:
            out.append(rt.proc_id)
        missing = names - {p.name for p in out}
        if missing:
            raise ValueError(f"no proc {sorted(missing)} in this client")
        return out
    if "mesh" in query:
        return find_procs(node, query["mesh"][0], parse_coords(query.get("coords", [""])[0]))
    raise ValueError("say which procs: proc=NAME, or mesh=NAME with optional coords=dim=i,...")


def _all_procs(node: Node) -> list[Any]:
    """Every proc of the client's tree, those its actors spawned included."""
    return [e["id"] for e in discover(node)]


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


def serve_from_environment(node: Node) -> Dashboard | None:
    """Start ``node``'s dashboard once if the ``dashboard`` setting (``DANAUS_DASHBOARD=1``)
    is on."""
    if not config.get("dashboard"):
        return None
    part = node.part(FromEnvironment)
    with part.lock:
        if part.dashboard is None:
            part.dashboard = _serve(node)
            print(f"danaus dashboard: {part.dashboard.url}", file=sys.stderr, flush=True)
        return part.dashboard
