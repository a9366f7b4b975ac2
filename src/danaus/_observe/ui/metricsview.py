"""The metrics page's data: ``GET /api/ui/metrics?name=N&seconds=S[&mesh=M]``.

One series per actor (``MESH[RANK]``, and endpoint for the per-endpoint metrics) or,
for a proc's own metrics (bytes, frames, ``messages_seen``), per proc: the values of
metric ``N`` (a name of the ``metrics`` table; default ``calls``) over the last ``S``
seconds (default 300), oldest first, each ``[unix seconds, value]``. ``kind`` says
whether the metric counts up (``counter``: the page plots its rate per second) or is
a level (``gauge``).

Where the points come from: when a job's telemetry keeps history, the ``metrics``
table holds a row per metric per snapshot and the window is read from it; otherwise
the table has only the present, and this dashboard keeps what each request read
(at most once per ``dashboard_interval``, ``RING`` points a series), so the window
fills while a page watches.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any

from ... import _config as config
from ..._runtime.node import Node
from ..tables import COLUMNS
from ..web import Route, blocking
from .common import MAX_SECONDS, BadRequest, json_route, number, quote, table
from .entities import _history_path

__all__ = ["COUNTERS", "NAMES", "Recorder", "routes"]

NAMES = (
    "calls", "errors", "latency_sum_s", "latency_max_s", "latency_p50_s", "latency_p99_s",
    "received", "queued", "bytes_sent", "bytes_received", "frames_sent", "frames_received",
    "messages_seen", "transfers", "transfer_bytes", "transfer_s", "transfer_errors",
)  # fmt: skip
COUNTERS = frozenset(NAMES) - {"latency_max_s", "latency_p50_s", "latency_p99_s", "queued"}
RING = 1200  # points kept per series without history
MAX_POINTS = 600  # per series in one answer (evenly thinned beyond)
_KEYS = ("mesh", "rank", "endpoint", "proc")


class Recorder:
    """Without history: the metrics rows this dashboard read, a bounded ring per series."""

    def __init__(self, node: Node) -> None:
        self.node = node  # the dashboard's client, whose metrics table it reads
        self.lock = threading.Lock()  # guards series and last
        self.series: dict[tuple[Any, ...], collections.deque[tuple[float, float]]] = {}
        self.last = 0.0  # when the table was last read (monotonic)

    def sample(self) -> None:
        """Read the metrics table now, unless it was read less than an interval ago."""
        with self.lock:
            if time.monotonic() - self.last < config.get("dashboard_interval"):
                return
            self.last = time.monotonic()
        rows = table(self.node, "SELECT time, name, mesh, rank, endpoint, proc, value FROM metrics")
        with self.lock:
            for r in rows:
                key = (r["name"], *(r[k] for k in _KEYS))
                ring = self.series.get(key)
                if ring is None:
                    ring = self.series[key] = collections.deque(maxlen=RING)
                if r["value"] is not None and (not ring or ring[-1][0] < r["time"]):
                    ring.append((r["time"], r["value"]))

    def window(self, name: str, since: float) -> list[tuple[tuple[Any, ...], list[Any]]]:
        with self.lock:
            return [
                (key[1:], [[t, v] for t, v in ring if t >= since])
                for key, ring in self.series.items()
                if key[0] == name
            ]


def routes(dash: Any) -> dict[str, Route]:
    recorder = Recorder(dash.node)

    async def get(request: Any) -> Any:
        name = request.query.get("name", "") or "calls"
        if name not in NAMES:
            raise BadRequest(f"no metric {name!r}; the metrics are {', '.join(NAMES)}")
        seconds = number(request, "seconds", 300.0, 1.0, MAX_SECONDS)
        mesh = request.query.get("mesh") or None
        return await blocking(series, recorder, name, seconds, mesh)

    return {"/api/ui/metrics": json_route(get)}


def _order(s: dict[str, Any]) -> tuple[Any, ...]:
    """Actors' series by mesh, endpoint and rank, then the procs'."""
    rank = s["rank"] if s["rank"] is not None else -1
    return (s["mesh"] is None, str(s["mesh"]), str(s["endpoint"]), rank, str(s["proc"]))


def series(recorder: Recorder, name: str, seconds: float, mesh: str | None) -> dict[str, Any]:
    """The answer (see the module's docstring)."""
    now = time.time()
    since = now - seconds
    kept = _history_path() is not None
    groups: list[tuple[tuple[Any, ...], list[Any]]]
    if kept:
        where = f"name = {quote(name)} AND time >= {since!r}"
        if mesh:
            where += f" AND mesh = {quote(mesh)}"
        rows = table(
            recorder.node,
            f"SELECT time, mesh, rank, endpoint, proc, value FROM metrics WHERE {where} "
            "ORDER BY time",
        )
        by: dict[tuple[Any, ...], list[Any]] = {}
        for r in rows:
            if r["value"] is not None:
                by.setdefault(tuple(r[k] for k in _KEYS), []).append([r["time"], r["value"]])
        groups = list(by.items())
    else:
        recorder.sample()
        groups = [(k, pts) for k, pts in recorder.window(name, since) if not mesh or k[0] == mesh]
    out = []
    for (m, rank, endpoint, proc), pts in groups:
        if not pts:
            continue
        step = -(-len(pts) // MAX_POINTS)
        label = f"{m}[{rank}]" if m is not None else f"proc {proc}"
        out.append(
            {
                "label": label + (f".{endpoint}" if endpoint else ""),
                "mesh": m, "rank": rank, "endpoint": endpoint, "proc": proc,
                "points": pts[::step] if step > 1 else pts,
            }
        )  # fmt: skip
    out.sort(key=_order)
    return {
        "now": now,
        "since": since,
        "name": name,
        "kind": "counter" if name in COUNTERS else "gauge",
        "kept": kept,
        "names": list(NAMES),
        "description": dict((c[0], c[2]) for c in COLUMNS["metrics"]).get("name", ""),
        "series": out,
    }
