"""Telemetry kept on disk: the tables of ``danaus.telemetry.query`` in an embedded DuckDB
file, with Monarch's ``retention_secs`` and ``snapshot_interval_secs``.

``job.enable_telemetry(TelemetryConfig(...))`` then ``job.state()`` starts one
`History` in the client (``start``). It writes ``telemetry.duckdb`` in the
client's job directory, ``<log dir>/<job>/`` (where ``danaus logs`` finds the job's
log files), so a finished job's telemetry is there for ``danaus query --job JOB``.

- **Snapshots.** Every ``snapshot_interval_secs`` (and before each query) a thread
  asks every proc once, as a live query does (``tables.gather``), and writes: the
  ``metrics`` rows of that moment (a time series: one row per metric per snapshot,
  ``time`` the snapshot's, the same for every proc), and the ``gpus`` rows likewise,
  each actor's latest state (``actors``, one row per actor, kept after it stopped
  and after its proc is gone), and the ``messages`` and ``spans`` rows the procs'
  rings gained since the previous snapshot. The rings hold ``query_ring_size`` rows
  each: a proc that records more than that between two snapshots loses the oldest
  (``messages_seen`` in ``metrics`` counts every message). ``0``: no periodic
  snapshots, only those before queries.
- **Retention.** Rows of ``messages``, ``spans``, ``metrics`` and ``gpus`` older than
  ``retention_secs`` are deleted by a sweep that runs every tenth of the window,
  at least every 30 s and at most every 5 minutes, never less often than the window
  itself (Monarch's rule); queries do not sweep, so expired rows may show until the
  next sweep. ``actors`` is not swept. ``0``: nothing is deleted.

Queries (``danaus.telemetry.query``, ``state.query_engine_client``) read the file,
through the same checks as a live query: one ``SELECT``, no file access, bounded
rows, memory and time.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from .. import _config as config
from .._runtime.logs import dirs as logdir
from .._runtime.node import Node, this_node
from . import tables
from .tables import COLUMNS

__all__ = ["FILE", "History", "active", "open_file", "start", "stop", "sweep_interval"]

log = logging.getLogger("danaus.telemetry")

#: The file's name in the job directory.
FILE = "telemetry.duckdb"

_SWEPT = ("messages", "spans", "metrics", "gpus")  # the tables retention applies to (by time)
_TIME = {"messages": "ended", "spans": "ended", "metrics": "time", "gpus": "time"}

_lock = threading.Lock()
_active: History | None = None  # the process's: the client's running history


def sweep_interval(retention_s: float) -> float:
    """Seconds between two retention sweeps: a tenth of the window, within 30 s to 5
    minutes, and never longer than the window (Monarch's)."""
    return min(max(retention_s / 10, 30.0), 300.0, retention_s)


def _duckdb() -> Any:
    try:
        import duckdb
    except ImportError:
        raise ImportError(
            "keeping telemetry history needs DuckDB: pip install 'danaus[query]'"
        ) from None
    return duckdb


def open_file(path: str, read_only: bool) -> Any:
    """A DuckDB connection to a history file: no external access, memory bounded by
    ``query_max_memory``, and its configuration locked."""
    duckdb = _duckdb()
    con = duckdb.connect(
        path,
        read_only=read_only,
        config={
            "enable_external_access": False,
            "memory_limit": f"{max(1, config.get('query_max_memory') >> 20)}MiB",
        },
    )
    if not read_only:
        for table, cols in COLUMNS.items():
            columns = ", ".join(f'"{name}" {typ}' for name, typ, _ in cols)
            con.execute(f"CREATE TABLE IF NOT EXISTS {table} ({columns})")
    con.execute("SET lock_configuration = true")
    return con


class History:
    """The telemetry file of one client, and the thread that fills and sweeps it."""

    def __init__(self, node: Node, path: str, retention_s: float, snapshot_s: float) -> None:
        self.path = path
        self.retention_s = float(retention_s)
        self.snapshot_s = float(snapshot_s)
        self.con = open_file(path, read_only=False)
        self.lock = threading.Lock()  # one snapshot or sweep at a time
        # Per proc and ring: the keys of the rows the previous snapshot saw there.
        self._seen: dict[tuple[str, str], set[tuple[Any, ...]]] = {}
        self.snapshots = 0
        self.swept = 0  # rows deleted by retention
        self._stop = threading.Event()
        self._node = node  # the session's client: the procs it asks
        self._runtime = node.runtime
        self.thread = threading.Thread(
            target=self._run, name="danaus-telemetry-history", daemon=True
        )
        self.thread.start()

    # -- the thread --

    def _run(self) -> None:
        now = time.monotonic()
        next_snap = now + self.snapshot_s if self.snapshot_s > 0 else float("inf")
        next_sweep = (
            now + sweep_interval(self.retention_s) if self.retention_s > 0 else float("inf")
        )
        while not self._stop.is_set():
            wait = min(next_snap, next_sweep) - time.monotonic()
            if self._stop.wait(min(max(wait, 0.0), 3600.0)):
                return
            now = time.monotonic()
            try:
                if now >= next_snap:
                    self.snapshot()
                    next_snap = time.monotonic() + self.snapshot_s
                if now >= next_sweep:
                    self.sweep()
                    next_sweep = time.monotonic() + sweep_interval(self.retention_s)
            except _Stopped:
                return
            except Exception as e:  # a proc in trouble, a full disk: said, then tried again
                if self._stop.is_set():
                    return
                log.warning("telemetry history: %s: %s", type(e).__name__, e)

    # -- writing --

    def snapshot(self) -> None:
        """Ask every proc now and write what is new (see the module's docstring)."""
        node = this_node(start=False)
        if node is None or node.runtime is not self._runtime:
            return  # the session that started this history has ended
        snap = tables.gather(self._node, rings=True, check=self._check)
        taken = time.time()
        self._check()  # _actors reads the session's own records
        with self.lock:
            self._only_new(snap)
            names = tables._mesh_names(snap)
            rows = {
                "actors": tables._actors(snap),
                "messages": tables._messages(snap, names),
                "spans": tables._spans(snap),
                # one time per snapshot (the procs' answers differ by milliseconds), so
                # that a series groups by snapshot: GROUP BY time
                "metrics": [(taken, *r[1:]) for r in tables._metrics(snap)],
                "gpus": [(taken, *r[1:]) for r in tables._gpus(snap)],
            }
            con = self.con
            con.execute("BEGIN TRANSACTION")
            try:
                for table, got in rows.items():
                    if not got:
                        continue
                    _load(con, "new_rows", COLUMNS[table], got)
                    if table == "actors":  # each actor's latest state replaces its last
                        con.execute(
                            "DELETE FROM actors USING new_rows WHERE actors.proc = new_rows.proc "
                            "AND actors.mesh_id = new_rows.mesh_id AND actors.rank = new_rows.rank"
                        )
                    con.execute(f"INSERT INTO {table} SELECT * FROM new_rows")
                    con.execute("DROP TABLE new_rows")
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise
            self.snapshots += 1

    def _check(self) -> None:
        """Raise once the session has ended (or this history closed): a snapshot in
        progress stops between rounds instead of asking for a node that is gone
        (which would start a new one)."""
        node = this_node(start=False)
        if self._stop.is_set() or node is None or node.runtime is not self._runtime:
            raise _Stopped()

    def _only_new(self, snap: tables.Snapshot) -> None:
        """Keep in ``snap``'s rings only the rows the previous snapshot did not see."""
        for proc, ring in snap.rings.items():
            for name, key in (("messages", _message_key), ("spans", _span_key)):
                rows = ring[name]
                keys = [key(r) for r in rows]
                before = self._seen.get((proc, name), set())
                ring[name] = [r for r, k in zip(rows, keys, strict=True) if k not in before]
                self._seen[(proc, name)] = set(keys)
        gone = {p for p, _ in self._seen} - set(snap.rings)
        for p, name in list(self._seen):
            if p in gone:
                del self._seen[(p, name)]

    def sweep(self) -> int:
        """Delete the rows older than the retention window; how many were deleted."""
        if self.retention_s <= 0:
            return 0
        cutoff = time.time() - self.retention_s
        n = 0
        with self.lock:
            for table in _SWEPT:
                got = self.con.execute(
                    f"DELETE FROM {table} WHERE {_TIME[table]} < ?", [cutoff]
                ).fetchone()
                n += int(got[0]) if got else 0
        self.swept += n
        return n

    # -- reading --

    def series(self, seconds: float) -> list[dict[str, Any]]:
        """Each endpoint's calls per second and mean latency between consecutive
        snapshots of the last ``seconds`` (the dashboard's plots, from before the page
        was opened): ``[{"mesh_id", "mesh", "endpoint", "points": [[t, rate, mean_s],
        ...]}]``, summed over the ranks, oldest first."""
        cur = self.cursor()
        try:
            rows = cur.execute(
                """
                WITH per AS (
                    SELECT mesh_id, mesh, proc, rank, endpoint, time,
                           max(value) FILTER (WHERE name = 'calls') AS calls,
                           max(value) FILTER (WHERE name = 'latency_sum_s') AS total_s
                    FROM metrics
                    WHERE endpoint IS NOT NULL AND time >= ?
                    GROUP BY mesh_id, mesh, proc, rank, endpoint, time
                ), steps AS (  -- each actor's own counters, from one snapshot to its next
                    SELECT mesh_id, mesh, endpoint, time,
                           calls - lag(calls) OVER w AS dc,
                           total_s - lag(total_s) OVER w AS ds,
                           time - lag(time) OVER w AS dt
                    FROM per
                    WINDOW w AS (PARTITION BY mesh_id, proc, rank, endpoint ORDER BY time)
                )
                SELECT mesh_id, any_value(mesh), endpoint, time, sum(dc / dt),
                       CASE WHEN sum(dc) > 0 THEN sum(ds) / sum(dc) END
                FROM steps
                WHERE dt > 0 AND dc >= 0 AND ds >= 0  -- a restarted actor counts afresh
                GROUP BY mesh_id, endpoint, time
                ORDER BY mesh_id, endpoint, time
                """,
                [time.time() - seconds],
            ).fetchall()
        finally:
            cur.close()
        out: dict[tuple[str, str], dict[str, Any]] = {}
        for mesh_id, mesh, endpoint, t, rate, mean in rows:
            sr = out.setdefault(
                (mesh_id, endpoint),
                {"mesh_id": mesh_id, "mesh": mesh, "endpoint": endpoint, "points": []},
            )
            sr["points"].append([t, rate, mean])
        return list(out.values())

    def cursor(self) -> Any:
        """A connection of its own to the file, for one query (DuckDB's cursor)."""
        return self.con.cursor()

    def close(self) -> None:
        self._stop.set()
        if self.thread is not threading.current_thread():
            self.thread.join(timeout=30)
        with self.lock:
            try:
                self.con.close()
            except Exception:
                pass


class _Holder:
    """Node part: the history of this session, closed when the session ends."""

    def __init__(self) -> None:
        self.history: History | None = None

    def on_node_end(self) -> None:
        if self.history is not None:
            stop(self.history)
            self.history = None


class _Stopped(Exception):
    """The session of a history ended while it was taking a snapshot."""


def _message_key(r: Any) -> tuple[Any, ...]:
    return (r[0], r[1], r[3], r[4])  # arrived_ns, started_ns, mesh_id, rank


def _span_key(r: Any) -> tuple[Any, ...]:
    return (r[0], r[1], r[2], r[3])  # name, start_ns, end_ns, actor


def _load(con: Any, table: str, cols: list[tuple[str, str, str]], rows: list[Any]) -> None:
    columns = [list(c) for c in zip(*rows, strict=True)]
    select = ", ".join(
        f'unnest(${i}::{typ}[]) AS "{name}"' for i, (name, typ, _) in enumerate(cols, 1)
    )
    con.execute(f"CREATE TEMP TABLE {table} AS SELECT {select}", columns)


def active() -> History | None:
    """The history this client keeps, if a job's telemetry started one."""
    h = _active
    if h is None:
        return None
    node = this_node(start=False)
    return h if node is not None and node.runtime is h._runtime else None


def path_for(job: str) -> str:
    """The history file of job ``job`` on this host."""
    return os.path.join(logdir.job_dir(job), FILE)


def start(node: Node, retention_s: float, snapshot_s: float) -> History:
    """Keep this client's telemetry in its job directory's ``telemetry.duckdb``, as
    ``TelemetryConfig`` says (``JobTrait.enable_telemetry``, at ``state()``); a
    running history is reconfigured rather than started twice."""
    global _active
    with _lock:
        h = active()
        if h is not None:
            h.retention_s, h.snapshot_s = float(retention_s), float(snapshot_s)
            return h
        h = History(node, path_for(node.runtime.proc_id.name), retention_s, snapshot_s)
        node.part(_Holder).history = h  # closed when the session ends
        _active = h
        return h


def stop(h: History) -> None:
    """Close ``h`` (at the end of its session)."""
    global _active
    with _lock:
        if _active is h:
            _active = None
    h.close()
