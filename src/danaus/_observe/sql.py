"""SQL over a live mesh: ``danaus.telemetry.query(sql)``, answered by embedded DuckDB.

Each query gathers fresh rows (``tables.collect``: one ``STATS`` round, and
one ``TELEMETRY`` round when it reads actors, messages or spans), loads them
into a new in-memory DuckDB database, one column list per column (DuckDB
binds Python lists directly: no Arrow, no pandas), and runs the query there.
The database sees only those tables, and a query may only read them:

- one ``SELECT`` (or ``WITH ... SELECT``, ``DESCRIBE``, ``SHOW``) statement per query: ``COPY ...
  TO 'file'``, ``ATTACH``, ``INSTALL``, ``SET``, ``EXPORT`` and every other statement
  are refused before they run, since DuckDB's ``enable_external_access = false``
  alone still lets ``COPY`` write a file (issue 40, N5);
- ``enable_external_access`` is off (no file read, no extension loaded) and the
  configuration is locked (``lock_configuration``), so no statement turns it on again;
- at most ``query_max_rows`` rows come back and a query runs at most
  ``query_timeout`` (then DuckDB is interrupted); past either the error says so.

DuckDB is an optional extra (``pip install 'danaus[query]'``); the actor core
never imports it.
"""

from __future__ import annotations

import re
import threading
from typing import Any

from .. import _config as config
from .._runtime.node import Node, this_node
from . import history, monarch_tables
from .tables import COLUMNS, TABLES, collect

__all__ = ["QueryEngineClient", "QueryError", "query", "query_file", "query_on"]


class QueryError(ValueError):
    """The SQL is not valid over the telemetry tables (DuckDB's message says why)."""


def _duckdb() -> Any:
    try:
        import duckdb
    except ImportError:
        raise ImportError(
            "danaus.telemetry.query needs DuckDB: pip install 'danaus[query]'"
        ) from None
    return duckdb


def tables_named(sql: str) -> list[str]:
    """The telemetry tables ``sql`` mentions (all of them when it names none)."""
    if monarch_tables.asked():  # Monarch's tables are views over several of these
        return list(TABLES)
    words = {w.lower() for w in re.findall(r"[A-Za-z_]+", sql)}
    named = [t for t in TABLES if t in words]
    return named or list(TABLES)


def query(sql: str) -> list[dict[str, Any]]:
    """Run ``sql`` over the tables actors, messages, spans, metrics and gpus of this client's
    procs, as they are now; the rows as dicts (column name to value), in order.

    Only reading is allowed: one ``SELECT`` statement (``WITH``, ``DESCRIBE`` too), no
    file access. Blocks while the procs answer and the query runs. Raises ``TypeError``
    for anything but a string, ``QueryError`` (a ValueError) for SQL that DuckDB
    refuses (with its message and the tables' columns), for any other kind of
    statement, for an answer over ``query_max_rows`` rows and for a query running
    over ``query_timeout``.
    """
    return query_on(this_node(), sql)  # the public face: a user's query holds no node


def query_on(node: Node, sql: str) -> list[dict[str, Any]]:
    """`query()` over the procs of ``node``'s client (the dashboard's, which holds it)."""
    names, rows = _run(node, sql)
    return [dict(zip(names, row, strict=True)) for row in rows]


def _run(node: Node, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
    """``query``'s work: the answer's column names and its rows (tuples)."""
    if not isinstance(sql, str):
        raise TypeError(f"query() takes the SQL as a str, got {type(sql).__name__}")
    if not sql.strip():
        raise QueryError("the query is empty; e.g. SELECT endpoint, count(*) FROM messages "
                         "GROUP BY endpoint")  # fmt: skip
    duckdb = _duckdb()
    kept = history.active()
    if kept is not None:  # a job's telemetry keeps history: the query reads the file
        kept.snapshot()  # with what the procs hold now
        con = kept.cursor()
        try:
            return _execute(con, duckdb, sql)
        finally:
            con.close()
    data = collect(node, tables_named(sql))
    con = duckdb.connect(
        ":memory:",
        config={
            "enable_external_access": False,
            "memory_limit": f"{max(1, config.get('query_max_memory') >> 20)}MiB",
        },
    )
    try:
        for table, cols in COLUMNS.items():
            _load(con, table, cols, data.get(table, []))
        con.execute("SET lock_configuration = true")  # no SET undoes the settings above
        return _execute(con, duckdb, sql)
    finally:
        con.close()


def query_file(path: str, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Run ``sql`` over a history file (``telemetry.duckdb`` of a job, ``danaus query
    --job``), read-only, with [`query()`][danaus.telemetry.query]'s checks; its column names and
    rows."""
    if not isinstance(sql, str) or not sql.strip():
        raise QueryError("the query is empty; e.g. SELECT count(*) FROM messages")
    duckdb = _duckdb()
    try:
        con = history.open_file(path, read_only=True)
    except duckdb.IOException as e:
        raise QueryError(
            f"cannot open the telemetry history {path}: {e}. A job still running holds it: "
            "ask the running client instead (danaus query without --job)"
        ) from None
    try:
        return _execute(con, duckdb, sql)
    finally:
        con.close()


def _execute(con: Any, duckdb: Any, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Run the one SELECT ``sql`` on ``con`` within the limits: its column names and rows."""
    max_rows = config.get("query_max_rows")
    timeout = config.get("query_timeout")
    _check_read_only(con, duckdb, sql)
    timer = threading.Timer(timeout, con.interrupt)
    timer.daemon = True
    timer.start()
    try:
        cur = con.execute(sql)
        names = [d[0] for d in cur.description] if cur.description is not None else []
        rows = cur.fetchmany(max_rows + 1) if names else []
    except duckdb.InterruptException:
        raise QueryError(
            f"the query ran longer than query_timeout ({timeout:g} s) and was stopped; "
            "narrow it (WHERE, LIMIT) or raise DANAUS_QUERY_TIMEOUT"
        ) from None
    except duckdb.Error as e:
        raise QueryError(f"{e}\n\n{describe()}") from None
    finally:
        timer.cancel()
    if len(rows) > max_rows:
        raise QueryError(
            f"the query answers more than query_max_rows ({max_rows}) rows; add a LIMIT, "
            "aggregate (GROUP BY), or raise DANAUS_QUERY_MAX_ROWS"
        )
    return names, rows


class QueryEngineClient:
    """Monarch's ``state.query_engine_client`` (``JobTrait.enable_telemetry`` then
    ``job.state()``): ``query(sql)`` answers ``{"columns": [...], "rows": [{column:
    value}, ...]}`` as Monarch's does, over Monarch's tables (actors, meshes,
    messages, actor_status_events ...: ``monarch_tables``, views of the same data as
    ``danaus.telemetry.query``'s), in this process rather than through an HTTP
    sidecar. Errors are [`query()`][danaus.telemetry.query]'s (``QueryError`` says what was
    wrong)."""

    def __init__(self, node: Node) -> None:
        self._node = node  # the client's whose job state it belongs to

    def query(self, sql: str) -> dict[str, Any]:
        """Run one SELECT over Monarch's telemetry tables: its column names and rows."""
        with monarch_tables.monarch_schema():
            names, rows = _run(self._node, sql)
        return {"columns": names, "rows": [dict(zip(names, r, strict=True)) for r in rows]}

    def __repr__(self) -> str:
        return "QueryEngineClient(tables=" + ", ".join(monarch_tables.TABLES) + ")"


# Statements that only read: anything else (COPY, ATTACH, INSTALL, LOAD, SET, EXPORT,
# CREATE, INSERT, PRAGMA, CALL, EXPLAIN ANALYZE of any of those ...) is refused before
# it runs. WITH, FROM-first, DESCRIBE, SUMMARIZE and SHOW parse as SELECT.
_READING = ("SELECT",)


def _check_read_only(con: Any, duckdb: Any, sql: str) -> None:
    monarch_tables.install_if_asked(con)  # on the connection about to run sql
    try:
        statements = con.extract_statements(sql)
    except duckdb.Error as e:
        raise QueryError(f"{e}\n\n{describe()}") from None
    if len(statements) != 1:
        raise QueryError(
            f"give exactly one SELECT statement, got {len(statements)} statements in {sql!r}"
        )
    kind = str(statements[0].type).rsplit(".", 1)[-1]
    if kind not in _READING:
        raise QueryError(
            f"only SELECT queries are allowed (the telemetry is read-only and no file may "
            f"be read or written), got a {kind} statement: {sql!r}"
        )


def _load(con: Any, table: str, cols: list[tuple[str, str, str]], rows: list[Any]) -> None:
    columns = [list(c) for c in zip(*rows, strict=True)] if rows else [[] for _ in cols]
    select = ", ".join(
        f'unnest(${i}::{typ}[]) AS "{name}"' for i, (name, typ, _) in enumerate(cols, 1)
    )
    con.execute(f"CREATE TABLE {table} AS SELECT {select}", columns)


def describe() -> str:
    """The tables and their columns, one line a table."""
    if monarch_tables.asked():
        return monarch_tables.describe()
    return "\n".join(
        f"{t}({', '.join(name for name, _, _ in cols)})" for t, cols in COLUMNS.items()
    )
