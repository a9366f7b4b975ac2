"""Monarch's telemetry tables over a real job: the SQL of Monarch's own tests and docs
(python/tests/test_distributed_telemetry.py, docs/source/distributed-telemetry.md),
with only the imports changed, run through ``state.query_engine_client``'s class."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
from collections import Counter
from typing import Any

import pytest

from danaus._observe import monarch_tables
from danaus._observe.sql import QueryEngineClient, QueryError
from danaus._observe.tables import COLUMNS, collect
from danaus._runtime.node import this_node
from danaus.actor import Actor, ActorError, ProcMesh, endpoint, span
from danaus.testing import FaultRecorder

from .conftest import REPLY_TIMEOUT, Worker

duckdb = pytest.importorskip("duckdb")

# Monarch's schema (monarch_telemetry_schema/src/lib.rs), written out here rather
# than read from monarch_tables: u64 -> UBIGINT, i64 -> BIGINT, u32 -> UINTEGER.
MONARCH = {
    "actors": "id UBIGINT, timestamp_us BIGINT, mesh_id UBIGINT, rank UBIGINT, "
    "full_name VARCHAR, display_name VARCHAR",
    "meshes": "id UBIGINT, timestamp_us BIGINT, class VARCHAR, given_name VARCHAR, "
    "full_name VARCHAR, shape_json VARCHAR, parent_mesh_id UBIGINT, parent_view_json VARCHAR",
    "actor_status_events": "id UBIGINT, timestamp_us BIGINT, actor_id UBIGINT, "
    "new_status VARCHAR, reason VARCHAR",
    "sent_messages": "id UBIGINT, timestamp_us BIGINT, sender_actor_id UBIGINT, "
    "actor_mesh_id UBIGINT, view_json VARCHAR, shape_json VARCHAR",
    "messages": "id UBIGINT, timestamp_us BIGINT, from_actor_id UBIGINT, to_actor_id UBIGINT, "
    "endpoint VARCHAR, port_index UBIGINT",
    "message_status_events": "id UBIGINT, timestamp_us BIGINT, message_id UBIGINT, status VARCHAR",
    "spans": "id UBIGINT, name VARCHAR, target VARCHAR, level VARCHAR, fields_json VARCHAR, "
    "timestamp_us BIGINT, parent_id UBIGINT, thread_name VARCHAR, file VARCHAR, line UINTEGER",
    "span_events": "id UBIGINT, timestamp_us BIGINT, event_type VARCHAR",
    "events": "name VARCHAR, target VARCHAR, level VARCHAR, fields_json VARCHAR, "
    "timestamp_us BIGINT, parent_span UBIGINT, thread_id VARCHAR, thread_name VARCHAR, "
    "module_path VARCHAR, file VARCHAR, line UINTEGER",
    "metric_gauges": "name VARCHAR, timestamp_us BIGINT, start_timestamp_us BIGINT, "
    "scope_name VARCHAR, unit VARCHAR, attributes_json VARCHAR, "
    "resource_attributes_json VARCHAR, value_f64 DOUBLE, value_i64 BIGINT, value_u64 UBIGINT",
    "metric_sums": "name VARCHAR, timestamp_us BIGINT, start_timestamp_us BIGINT, "
    "scope_name VARCHAR, unit VARCHAR, temporality VARCHAR, is_monotonic BOOLEAN, "
    "attributes_json VARCHAR, resource_attributes_json VARCHAR, sum_f64 DOUBLE, "
    "sum_i64 BIGINT, sum_u64 UBIGINT",
    "metric_histograms": "name VARCHAR, timestamp_us BIGINT, start_timestamp_us BIGINT, "
    "scope_name VARCHAR, unit VARCHAR, temporality VARCHAR, attributes_json VARCHAR, "
    "resource_attributes_json VARCHAR, count UBIGINT, sum_f64 DOUBLE, sum_i64 BIGINT, "
    "sum_u64 UBIGINT, min_f64 DOUBLE, min_i64 BIGINT, min_u64 UBIGINT, max_f64 DOUBLE, "
    "max_i64 BIGINT, max_u64 UBIGINT, bounds_json VARCHAR, bucket_counts_json VARCHAR",
}


class Sender(Actor):
    """Calls another actor mesh from an endpoint (Monarch's SenderActor)."""

    @endpoint
    def send_ping(self, target: Any) -> None:
        target.ping.call().get(timeout=REPLY_TIMEOUT)


class Traced(Actor):
    @endpoint
    def emit_trace(self, name: str) -> None:
        with span(name):
            pass


class _Client:
    """The query client of the current session's node, as ``job.state()`` gives it (a
    client is made for its node; the tests' sessions may change between modules)."""

    def query(self, sql: str) -> dict[str, Any]:
        return QueryEngineClient(this_node()).query(sql)


client = _Client()


def _query(sql: str) -> dict[str, list[Any]]:
    """Monarch's test helper: the rows as one list per column."""
    rows = client.query(sql)["rows"]
    if not rows:
        return {}
    return {column: [row.get(column) for row in rows] for column in rows[0]}


def test_each_monarch_table_has_monarchs_columns_and_types(procs: ProcMesh) -> None:
    rows = client.query(
        "SELECT table_name, column_name, data_type FROM information_schema.columns "
        "WHERE table_catalog = 'temp' ORDER BY table_name, ordinal_position"
    )["rows"]
    have: dict[str, list[str]] = {}
    for r in rows:
        have.setdefault(r["table_name"], []).append(f"{r['column_name']} {r['data_type']}")
    assert {t: ", ".join(cols) for t, cols in have.items()} == MONARCH
    assert client.query("SELECT * FROM message_status_events LIMIT 0")["columns"] == [
        "id", "timestamp_us", "message_id", "status"
    ]  # fmt: skip


def test_the_actors_table_lists_the_spawned_actors_with_their_mesh(procs: ProcMesh) -> None:
    workers = procs.spawn("test_worker", Worker)
    workers.initialized.get(timeout=REPLY_TIMEOUT)
    result = _query(
        "SELECT a.* FROM actors a JOIN meshes mesh ON a.mesh_id = mesh.id "
        "WHERE mesh.given_name = 'test_worker'"
    )
    assert set(result) == {"id", "timestamp_us", "mesh_id", "rank", "full_name", "display_name"}
    assert sorted(result["rank"]) == [0, 1] and len(set(result["id"])) == 2
    assert all(result["full_name"]) and all(t > 0 for t in result["timestamp_us"])
    assert sorted(result["display_name"]) == ["test_worker[0]", "test_worker[1]"]

    workers.ping.call().get(timeout=REPLY_TIMEOUT)  # the client's root actor sends
    assert "<root>" in _query("SELECT display_name FROM actors")["display_name"]

    rows = client.query(
        """SELECT a.full_name AS actor_name, a.mesh_id, a.rank,
                  m.given_name AS mesh_name, m.class AS mesh_class
           FROM actors a INNER JOIN meshes m ON a.mesh_id = m.id
           WHERE m.given_name = 'test_worker' ORDER BY a.rank"""
    )["rows"]
    assert [(r["rank"], r["mesh_name"], r["mesh_class"]) for r in rows] == [
        (0, "test_worker", "Python<Worker>"),
        (1, "test_worker", "Python<Worker>"),
    ]


def test_the_meshes_table_has_given_and_full_names(procs: ProcMesh) -> None:
    procs.spawn("test_mesh_worker", Worker).initialized.get(timeout=REPLY_TIMEOUT)
    result = _query("SELECT * FROM meshes WHERE given_name = 'test_mesh_worker'")
    assert result["given_name"] == ["test_mesh_worker"]
    [full] = result["full_name"]
    assert full != "test_mesh_worker" and full.startswith("test_mesh_worker")
    assert result["class"] == ["Python<Worker>"]
    [mesh_id] = result["id"]
    ranks = _query(f"SELECT rank FROM actors WHERE mesh_id = {mesh_id} ORDER BY rank")
    assert ranks["rank"] == [0, 1]


def test_messages_count_the_calls_and_join_their_senders(procs: ProcMesh) -> None:
    workers = procs.spawn("msg_test_worker", Worker)
    for _ in range(5):
        workers.ping.call().get(timeout=REPLY_TIMEOUT)
    joined = _query(
        "SELECT m.id, m.from_actor_id FROM messages m "
        "JOIN actors a ON m.to_actor_id = a.id "
        "JOIN meshes mesh ON a.mesh_id = mesh.id "
        "WHERE mesh.given_name = 'msg_test_worker'"
    )
    assert len(joined["id"]) == 10 and len(set(joined["id"])) == 10  # 5 calls x 2 ranks
    [sender] = set(joined["from_actor_id"])
    assert _query(f"SELECT display_name FROM actors WHERE id = {sender}") == {
        "display_name": ["<root>"]
    }
    endpoints = _query(
        "SELECT m.endpoint FROM messages m JOIN actors a ON m.to_actor_id = a.id "
        "JOIN meshes mesh ON a.mesh_id = mesh.id "
        "WHERE mesh.given_name = 'msg_test_worker' AND m.endpoint IS NOT NULL"
    )["endpoint"]
    assert endpoints == ["ping"] * 10

    # An actor calling another mesh is the sender of what that mesh receives.
    targets = procs.spawn("target_workers", Worker)
    sender_mesh = procs.slice(gpus=0).spawn("sender_actor", Sender)
    sender_mesh.send_ping.call_one(targets).get(timeout=REPLY_TIMEOUT)
    got = _query(
        "SELECT s.display_name FROM messages m "
        "JOIN actors t ON m.to_actor_id = t.id JOIN meshes tm ON t.mesh_id = tm.id "
        "JOIN actors s ON m.from_actor_id = s.id "
        "WHERE tm.given_name = 'target_workers'"
    )
    assert got["display_name"] == ["sender_actor[0]"] * 2


def test_each_message_is_queued_active_then_complete_or_failed(procs: ProcMesh) -> None:
    workers = procs.spawn("status_msgs", Worker)
    workers.ping.call().get(timeout=REPLY_TIMEOUT)
    with pytest.raises(ActorError):
        workers.slice(gpus=0).boom.call_one().get(timeout=REPLY_TIMEOUT)
    messages = client.query(
        "SELECT msg.id, msg.timestamp_us, msg.endpoint FROM messages msg "
        "JOIN actors receiver ON msg.to_actor_id = receiver.id "
        "JOIN meshes target ON receiver.mesh_id = target.id "
        "WHERE target.given_name = 'status_msgs'"
    )["rows"]
    assert Counter(m["endpoint"] for m in messages) == {"ping": 2, "boom": 1}
    ids = ", ".join(str(m["id"]) for m in messages)
    events = client.query(  # ids hold from one query to the next
        "SELECT e.id, e.timestamp_us, e.message_id, e.status, msg.timestamp_us AS msg_us "
        "FROM message_status_events e JOIN messages msg ON e.message_id = msg.id "
        f"WHERE e.message_id IN ({ids})"
    )["rows"]
    assert len({e["id"] for e in events}) == 9
    for m in messages:
        mine = {e["status"]: e for e in events if e["message_id"] == m["id"]}
        end = "failed" if m["endpoint"] == "boom" else "complete"
        assert set(mine) == {"queued", "active", end}
        # one query's times are read against one reading of each proc's clocks
        assert mine["active"]["timestamp_us"] == mine["active"]["msg_us"]
        us = [mine[s]["timestamp_us"] for s in ("queued", "active", end)]
        assert us == sorted(us)


def test_actor_status_events_say_created_idle_and_failed_with_the_reason(
    procs: ProcMesh, faults: FaultRecorder
) -> None:
    workers = procs.spawn("status_test_worker", Worker)
    workers.initialized.get(timeout=REPLY_TIMEOUT)
    rows = client.query(
        "SELECT ase.actor_id, ase.new_status, ase.reason FROM actor_status_events ase "
        "JOIN actors a ON ase.actor_id = a.id JOIN meshes m ON a.mesh_id = m.id "
        "WHERE m.given_name = 'status_test_worker'"
    )["rows"]
    by_actor: dict[int, set[str]] = {}
    for r in rows:
        by_actor.setdefault(r["actor_id"], set()).add(r["new_status"])
    assert list(by_actor.values()) == [{"Created", "Idle"}] * 2
    assert all(r["reason"] is None for r in rows)

    failing = procs.slice(gpus=1).spawn("telemetry_failure", Worker)
    failing.initialized.get(timeout=REPLY_TIMEOUT)
    failing.boom.broadcast()  # nobody to tell: the actor fails
    faults.crashed("telemetry_failure", {0})
    actor_id = _query(
        "SELECT a.id FROM actors a JOIN meshes m ON a.mesh_id = m.id "
        "WHERE m.given_name = 'telemetry_failure'"
    )["id"][0]
    rows = client.query(
        f"SELECT new_status, reason FROM actor_status_events WHERE actor_id = {actor_id}"
    )["rows"]
    assert {r["new_status"] for r in rows} == {"Created", "Failed"}
    [reason] = [r["reason"] for r in rows if r["new_status"] == "Failed"]
    assert "boom on purpose" in reason
    # the docs' example query
    failed = _query(
        "SELECT a.full_name, s.reason, s.timestamp_us FROM actor_status_events AS s "
        "JOIN actors AS a ON a.id = s.actor_id WHERE s.new_status = 'Failed' "
        "ORDER BY s.timestamp_us DESC LIMIT 100"
    )
    assert any(name.endswith("[0]") and "telemetry_failure" in name
               for name in failed["full_name"])  # fmt: skip


def test_metric_sums_hold_the_endpoint_counters(procs: ProcMesh) -> None:
    workers = procs.spawn("metrics_test_worker", Worker)
    for _ in range(3):
        workers.ping.call().get(timeout=REPLY_TIMEOUT)
    rows = _query(
        "SELECT name, attributes_json, resource_attributes_json, sum_u64 AS metric_sum, "
        "temporality, is_monotonic FROM metric_sums WHERE name = 'danaus.endpoint.calls' "
        "AND sum_u64 > 0"
    )
    mine = [
        (json.loads(a), s)
        for a, s in zip(rows["attributes_json"], rows["metric_sum"], strict=True)
        if json.loads(a).get("danaus.mesh") == "metrics_test_worker"
    ]
    assert sorted((a["danaus.rank"], a["danaus.endpoint"], s) for a, s in mine) == [
        (0, "ping", 3),
        (1, "ping", 3),
    ]
    assert set(rows["temporality"]) == {"cumulative"} and all(rows["is_monotonic"])
    assert all(json.loads(r)["danaus.proc"] for r in rows["resource_attributes_json"])
    sent = _query(
        "SELECT scope_name, SUM(sum_u64) AS sent FROM metric_sums "
        "WHERE name = 'danaus.proc.bytes_sent' GROUP BY scope_name"
    )
    assert sent["scope_name"] == ["danaus"] and sent["sent"][0] > 0


def test_spans_and_their_events(procs: ProcMesh) -> None:
    traced = procs.slice(gpus=0).spawn("traced", Traced)
    traced.emit_trace.call_one("my_span").get(timeout=REPLY_TIMEOUT)
    spans = client.query(
        "SELECT id, name, target, timestamp_us, thread_name FROM spans "
        "WHERE name IN ('my_span', 'Traced.emit_trace') ORDER BY name"
    )["rows"]
    assert [(s["name"], s["target"], s["thread_name"]) for s in spans] == [
        ("Traced.emit_trace", "danaus.endpoint", "traced[0]"),
        ("my_span", "danaus.user", "traced[0]"),
    ]
    events = client.query(
        "SELECT e.id, e.event_type, e.timestamp_us, s.timestamp_us AS span_us "
        "FROM span_events e JOIN spans s ON e.id = s.id "
        "WHERE s.name = 'my_span' ORDER BY e.timestamp_us, e.event_type"
    )["rows"]
    assert [e["event_type"] for e in events] == ["enter", "close", "exit"]
    assert {e["id"] for e in events} == {spans[1]["id"]}  # the same id in the next query
    # times within one query are read against one reading of the proc's clocks
    assert events[0]["timestamp_us"] == events[0]["span_us"] <= events[1]["timestamp_us"]


def test_views_work_on_a_history_file_as_on_live_rows(procs: ProcMesh, tmp_path: Any) -> None:
    """The kept history is a DuckDB file holding danaus's tables under their names:
    the views read them there the same, through a cursor, as the query client does."""
    workers = procs.spawn("in_a_file", Worker)
    workers.ping.call().get(timeout=REPLY_TIMEOUT)
    con = duckdb.connect(str(tmp_path / "telemetry.duckdb"))
    for table, rows in collect(this_node()).items():
        cols = COLUMNS[table]
        con.execute(f"CREATE TABLE {table} ({', '.join(f'{n} {t}' for n, t, _ in cols)})")
        if rows:
            marks = ", ".join("?" for _ in cols)
            con.executemany(f"INSERT INTO {table} VALUES ({marks})", rows)
    cur = con.cursor()
    monarch_tables.install(cur)
    got = cur.execute(
        "SELECT a.rank, count(*) FROM messages m JOIN actors a ON m.to_actor_id = a.id "
        "JOIN meshes mesh ON a.mesh_id = mesh.id WHERE mesh.given_name = 'in_a_file' "
        "GROUP BY a.rank ORDER BY a.rank"
    ).fetchall()
    assert got == [(0, 1), (1, 1)]
    # the views are the cursor's own: danaus's tables keep their columns elsewhere
    assert "mesh" in [d[0] for d in con.execute("SELECT * FROM actors LIMIT 0").description]
    cur.close()
    con.close()


def test_bad_sql_lists_monarchs_tables() -> None:
    with pytest.raises(QueryError, match=r"(?s)nosuch.*meshes\(id, timestamp_us"):
        client.query("SELECT * FROM nosuch")


def test_the_docs_list_every_monarch_table_and_column_as_mapped() -> None:
    text = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "monarch-tables.md").read_text()
    for table, cols in monarch_tables.COLUMNS.items():
        m = re.search(rf"^### `{table}`\n(.*?)(?=^#|\Z)", text, re.M | re.S)
        assert m, f"docs/monarch-tables.md has no '### `{table}`' section"
        rows = re.findall(r"^\| `(\w+)` \| (\w+) \| (.*) \|$", m.group(1), re.M)
        assert rows == cols, f"docs/monarch-tables.md: table {table}"
    for tables in monarch_tables.NOT_MAPPED:
        for t in tables.split(", "):
            assert f"`{t}`" in text, t


_JOB = """
import json
from danaus.actor import Actor, endpoint
from danaus.job import LocalJob, TelemetryConfig

class WorkerActor(Actor):
    @endpoint
    def ping(self) -> None:
        pass

    @endpoint
    def fail(self) -> None:
        raise RuntimeError("telemetry failure")

job = LocalJob().enable_telemetry(TelemetryConfig(retention_secs=3600))
state = job.state(cached_path=None)
client = state.query_engine_client

def q(sql):
    return client.query(sql)["rows"]

procs = state.hosts.spawn_procs(per_host={"workers": 2})
workers = procs.spawn("ep_test_worker", WorkerActor)
for _ in range(3):
    workers.ping.call().get(timeout=60)
try:
    workers.slice(workers=0).fail.call_one().get(timeout=60)
except Exception:
    pass
out = {}
out["endpoints"] = [r["endpoint"] for r in q(
    "SELECT m.endpoint FROM messages m JOIN actors a ON m.to_actor_id = a.id "
    "JOIN meshes mesh ON a.mesh_id = mesh.id "
    "WHERE mesh.given_name = 'ep_test_worker' AND m.endpoint IS NOT NULL")]
[failed] = q("SELECT msg.id FROM messages msg JOIN actors a ON msg.to_actor_id = a.id "
             "JOIN meshes m ON a.mesh_id = m.id "
             "WHERE m.given_name = 'ep_test_worker' AND msg.endpoint = 'fail'")
out["failed_statuses"] = sorted(r["status"] for r in q(
    f"SELECT status, timestamp_us FROM message_status_events WHERE message_id = {failed['id']}"))
out["statuses"] = q("SELECT new_status, COUNT(*) AS count FROM actor_status_events "
                    "GROUP BY new_status ORDER BY count DESC")
# counters are cumulative: each series' latest (largest) point, summed
out["calls"] = q("SELECT SUM(latest) AS calls FROM (SELECT attributes_json, "
                 "max(sum_u64) AS latest FROM metric_sums WHERE name = 'danaus.endpoint.calls' "
                 "AND json_extract_string(attributes_json, '$.\\"danaus.mesh\\"') "
                 "= 'ep_test_worker' "
                 "GROUP BY attributes_json)")
print(json.dumps(out))
procs.stop().get(timeout=60)
job.kill()
"""


@pytest.mark.timeout(150)
def test_a_job_with_telemetry_answers_monarchs_queries() -> None:
    """Through ``enable_telemetry`` and ``job.state()``, as a Monarch notebook does: ids
    read in one query find their rows in the next."""
    r = subprocess.run(
        [sys.executable, "-c", _JOB],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(pathlib.Path(monarch_tables.__file__).parents[2])},
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-6000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert Counter(got["endpoints"]) == {"ping": 6, "fail": 1}
    assert got["failed_statuses"] == ["active", "failed", "queued"]
    statuses = {s["new_status"]: s["count"] for s in got["statuses"]}
    assert statuses["Created"] >= 2 and statuses["Idle"] >= 2
    assert got["calls"] == [{"calls": 7}]
