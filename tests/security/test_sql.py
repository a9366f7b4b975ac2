"""Telemetry SQL (``danaus.telemetry.query``, the dashboard's ``/api/query``) only reads the
telemetry tables: no file written or read, capped in rows and time (issue 40, N5)."""

from __future__ import annotations

import json
import pathlib
import urllib.error
import urllib.parse
import urllib.request

import pytest

import danaus.dashboard
from danaus import config, telemetry

TIMEOUT = 30.0


def _dashboard_query(d: danaus.dashboard.Dashboard, sql: str) -> tuple[int, dict[str, object]]:
    q = urllib.parse.urlencode({"token": d.token, "sql": sql})
    try:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{d.port}/api/query?{q}", timeout=TIMEOUT
        ) as r:
            return int(r.status), json.load(r)
    except urllib.error.HTTPError as e:
        with e:
            return int(e.code), json.load(e)


@pytest.mark.parametrize(
    "sql",
    [
        "COPY (SELECT 1 AS a) TO '{out}'",
        "COPY (SELECT 1 AS a) TO 'stolen.csv'",  # the working directory
        "COPY actors TO '{out}' (FORMAT csv)",
        "EXPORT DATABASE '{dir}'",
        "EXPLAIN ANALYZE COPY (SELECT 1) TO '{out}'",
        "SELECT 1; COPY (SELECT 1) TO '{out}'",
    ],
)
def test_a_query_writes_no_file(
    sql: str, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    text = sql.format(out=tmp_path / "stolen.csv", dir=tmp_path / "export")
    with pytest.raises(telemetry.QueryError, match=r"only SELECT|exactly one SELECT"):
        telemetry.query(text)
    d = danaus.dashboard.serve()
    try:
        code, answer = _dashboard_query(d, text)
    finally:
        d.stop()
    assert code == 400 and "SELECT" in str(answer["error"])
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM read_csv('/etc/passwd')",
        "SELECT * FROM read_text('/etc/hostname')",
        "SELECT * FROM glob('/*')",
    ],
)
def test_a_query_reads_no_file(sql: str) -> None:
    with pytest.raises(telemetry.QueryError, match=r"(?i)disabled|external access|permission"):
        telemetry.query(sql)


@pytest.mark.parametrize(
    "sql",
    [
        "SET enable_external_access = true",
        "ATTACH '/tmp/x.db' AS x",
        "INSTALL httpfs",
        "LOAD httpfs",
        "PRAGMA enable_profiling",
        "CREATE TABLE t AS SELECT 1",
    ],
)
def test_only_select_statements_run(sql: str) -> None:
    with pytest.raises(telemetry.QueryError, match="only SELECT queries are allowed"):
        telemetry.query(sql)


def test_an_answer_over_query_max_rows_fails_saying_so() -> None:
    with config.configured(query_max_rows=10):
        assert len(telemetry.query("SELECT * FROM range(10)")) == 10
        with pytest.raises(telemetry.QueryError, match=r"more than query_max_rows \(10\)"):
            telemetry.query("SELECT * FROM range(11)")
        d = danaus.dashboard.serve()
        try:
            code, answer = _dashboard_query(d, "SELECT * FROM range(2000000)")
        finally:
            d.stop()
        assert code == 400 and "query_max_rows" in str(answer["error"])


def test_a_query_over_query_timeout_is_stopped_saying_so() -> None:
    # Ten billion rows: minutes of work, interrupted after a fraction of a second.
    endless = "SELECT sum(a.range * b.range) FROM range(100000) a, range(100000) b"
    with (
        config.configured(query_timeout=0.2),
        pytest.raises(telemetry.QueryError, match=r"longer than query_timeout"),
    ):
        telemetry.query(endless)
