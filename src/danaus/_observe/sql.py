"""SQL over a live mesh: ``danaus.telemetry.query(sql)``, answered by embedded DuckDB.

Each query gathers fresh rows (``tables.collect``: one ``STATS`` round, and
one ``TELEMETRY`` round when it reads actors, messages or spans), loads them
into a new in-memory DuckDB database, one column list per column (DuckDB
binds Python lists directly: no Arrow, no pandas), and runs the query there.
The database sees only those tables: ``enable_external_access`` is off, so a
query reads no file and loads no extension. DuckDB is an optional extra
(``pip install 'danaus[query]'``); the actor core never imports it.
"""

from __future__ import annotations

import re
from typing import Any

from .tables import COLUMNS, TABLES, collect

__all__ = ["QueryError", "query"]


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
    words = {w.lower() for w in re.findall(r"[A-Za-z_]+", sql)}
    named = [t for t in TABLES if t in words]
    return named or list(TABLES)


def query(sql: str) -> list[dict[str, Any]]:
    """Run ``sql`` over the tables actors, messages, spans and metrics of this client's
    procs, as they are now; the rows as dicts (column name to value), in order.

    Raises ``TypeError`` for anything but a string, ``QueryError`` (a ValueError) for
    SQL that DuckDB refuses, with its message and the tables' columns.
    """
    if not isinstance(sql, str):
        raise TypeError(f"query() takes the SQL as a str, got {type(sql).__name__}")
    if not sql.strip():
        raise QueryError("the query is empty; e.g. SELECT endpoint, count(*) FROM messages "
                         "GROUP BY endpoint")  # fmt: skip
    duckdb = _duckdb()
    data = collect(tables_named(sql))
    con = duckdb.connect(":memory:", config={"enable_external_access": False})
    try:
        for table, cols in COLUMNS.items():
            _load(con, table, cols, data.get(table, []))
        try:
            cur = con.execute(sql)
        except duckdb.Error as e:
            raise QueryError(f"{e}\n\n{describe()}") from None
        if cur.description is None:  # a statement without rows
            return []
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
    finally:
        con.close()


def _load(con: Any, table: str, cols: list[tuple[str, str, str]], rows: list[Any]) -> None:
    columns = [list(c) for c in zip(*rows, strict=True)] if rows else [[] for _ in cols]
    select = ", ".join(
        f'unnest(${i}::{typ}[]) AS "{name}"' for i, (name, typ, _) in enumerate(cols, 1)
    )
    con.execute(f"CREATE TABLE {table} AS SELECT {select}", columns)


def describe() -> str:
    """The tables and their columns, one line a table."""
    return "\n".join(
        f"{t}({', '.join(name for name, _, _ in cols)})" for t, cols in COLUMNS.items()
    )
