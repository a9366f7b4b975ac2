"""The telemetry tables from one round's answers, without asking any proc: each proc's
clock stamps become wall times with that proc's own clocks, rows follow ``COLUMNS``,
and a lost proc's answer is told apart from an answer."""

from __future__ import annotations

import json
import pathlib
import re
from typing import Any

import pytest

import danaus.dashboard
from danaus._observe import prom, state, tables
from danaus._observe.tables import COLUMNS, Snapshot
from danaus._wire.ids import ProcId

NS = 1_000_000_000
DOCS = pathlib.Path(__file__).resolve().parents[3] / "docs" / "observing.md"


def _ring(host: str, now_ns: int, now_s: float, **kw: Any) -> dict[str, Any]:
    return {"host": host, "now_ns": now_ns, "now_s": now_s, "messages": [], "spans": [],
            "ended": [], **kw}  # fmt: skip


def _answer(
    host: str, t: float, actors: list[dict[str, Any]], conns: list[dict[str, int]]
) -> dict[str, Any]:
    return {"host": host, "time": t, "actors": actors, "connections": conns}


def _actor(name: str, mesh_id: str, rank: int, **kw: Any) -> dict[str, Any]:
    base = {"name": name, "mesh_id": mesh_id, "rank": rank, "class": "m.C", "state": "idle",
            "started": 1.0, "failure": None, "received": 3, "queued": 0,
            "endpoints": {}}  # fmt: skip
    return {**base, **kw}


def test_message_rows_use_each_procs_own_clock_and_follow_the_columns() -> None:
    # Two procs whose monotonic clocks are far apart: each answer carries both its clocks.
    ring_a = _ring("h1", now_ns=500 * NS, now_s=1_000.0, messages=[
        # arrived, started, ended, mesh_id, rank, method, sender, req, rep, ok, stride
        (497 * NS, 498 * NS, 499 * NS, "workers.ab12", 1, "step", "client", 100, 20, True, 4),
    ])  # fmt: skip
    ring_b = _ring("h2", now_ns=7 * NS, now_s=1_000.0, messages=[
        (5 * NS, 5 * NS, 6 * NS, "gone.ff00", 0, "ping", "p/a[0]", 10, None, False, 1),
    ])  # fmt: skip
    snap = Snapshot([], {"a": ring_a, "b": ring_b})
    rows = tables._messages(snap, {"workers.ab12": "workers"})
    assert all(len(r) == len(COLUMNS["messages"]) for r in rows)
    by = [dict(zip([c[0] for c in COLUMNS["messages"]], r, strict=True)) for r in rows]
    assert by[0]["receiver"] == "workers[1]" and by[0]["host"] == "h1"
    assert (by[0]["arrived"], by[0]["started"], by[0]["ended"]) == (997.0, 998.0, 999.0)
    assert (by[0]["queued_s"], by[0]["handled_s"]) == (1.0, 1.0)
    assert by[0]["sample_rate"] == 0.25  # one in four recorded
    # a mesh the round did not name is called by its id's prefix
    assert by[1]["mesh"] == "gone" and by[1]["arrived"] == 998.0 and by[1]["ok"] is False
    assert by[1]["reply_bytes"] is None


def test_span_rows_carry_their_attributes_as_json() -> None:
    ring = _ring("h1", now_ns=10 * NS, now_s=50.0, spans=[
        ("restart a", 8 * NS, 9 * NS, None, "t1", "s1", None, {"ranks": [0], "why": object}),
    ])  # fmt: skip
    (row,) = tables._spans(Snapshot([], {"p": ring}))
    assert len(row) == len(COLUMNS["spans"])
    name, actor, proc, host, start, end, duration, *_, attrs = row
    assert (name, actor, proc, host, start, end, duration) == (
        "restart a",
        None,
        "p",
        "h1",
        48.0,
        49.0,
        1.0,
    )
    assert json.loads(attrs)["ranks"] == [0]  # what JSON cannot hold is its str


def test_metric_rows_per_endpoint_actor_and_proc_and_none_for_a_silent_proc() -> None:
    raw = {"calls": 4, "errors": 1, "total_s": 2.0, "max_s": 0.9, "buckets": {}}
    actor = _actor("w", "w.1", 0, endpoints={"step": raw}, received=9, queued=2)
    conns = [{"bytes_sent": 10, "bytes_recv": 5, "frames_sent": 1, "frames_recv": 2}] * 2
    ok = {"id": ProcId("p0", "host:h1"), "answer": (True, _answer("h1", 7.0, [actor], conns)),
          "lost": None}  # fmt: skip
    silent = {"id": ProcId("p1", "host:h2"), "answer": (False, "timed out"), "lost": None}
    rows = tables._metrics(Snapshot([ok, silent], {}))
    assert all(len(r) == len(COLUMNS["metrics"]) for r in rows)
    values = {(r[6], r[7]): r[8] for r in rows}
    assert values[("step", "calls")] == 4 and values[("step", "errors")] == 1
    assert values[("step", "latency_sum_s")] == pytest.approx(2.0)  # mean x calls
    assert values[("step", "latency_max_s")] == 0.9
    assert (values[(None, "received")], values[(None, "queued")]) == (9, 2)
    assert (values[(None, "bytes_sent")], values[(None, "frames_received")]) == (20, 4)
    assert {r[1] for r in rows} == {"p0"}


def test_a_proc_that_did_not_answer_is_placed_by_its_address() -> None:
    assert tables._host({"id": ProcId("p", "unix:/s;host:h9"), "answer": (False, "x")}) == "h9"
    assert tables._host({"id": ProcId("p", "unix:/s"), "answer": (False, "x")}) is None
    assert tables._host({"id": ProcId("p", "host:h9"), "answer": (True, {"host": "h1"})}) == "h1"


def test_mesh_names_come_from_live_actors_then_from_ended_ones() -> None:
    live = {"id": ProcId("p", ""), "answer": (True, _answer("h", 0, [_actor("a", "a.1", 0)], []))}
    ring = _ring("h", 0, 0.0, ended=[{"mesh_id": "a.1", "name": "old"},
                                      {"mesh_id": "b.2", "name": "b"}])  # fmt: skip
    assert tables._mesh_names(Snapshot([live], {"p": ring})) == {"a.1": "a", "b.2": "b"}


def test_an_unknown_table_is_refused_before_any_proc_is_asked() -> None:
    with pytest.raises(ValueError, match=r"no telemetry table \['nope'\]; there are"):
        tables.collect(None, ["actors", "nope"])  # type: ignore[arg-type]


def test_a_mesh_state_is_the_most_alarming_of_its_ranks() -> None:
    assert state._mesh_state(["idle", "restarting", "failed"]) == "restarting"
    assert state._mesh_state(["idle", "dead"]) == "failed"
    assert state._mesh_state(["stopped", "stopping"]) == "stopped"
    assert state._mesh_state(["idle", "not answering"]) == "starting"
    assert state._mesh_state(["idle", "running step()"]) == "alive"
    assert state._mesh_state([]) == "alive"


def test_a_rank_maps_to_row_major_coordinates() -> None:
    labels, sizes = ["hosts", "gpus"], [2, 4]
    coords = [state._coords(i, labels, sizes) for i in range(8)]
    assert coords[0] == {"hosts": 0, "gpus": 0} and coords[5] == {"hosts": 1, "gpus": 1}
    assert list(coords[7]) == labels  # in the mesh's label order
    assert len({tuple(c.values()) for c in coords}) == 8


def test_prometheus_buckets_are_cumulative_and_end_with_the_total() -> None:
    n = len(prom._LE)
    out = prom._cumulative({0: 2, 3: 5, n + 5: 1}, total=8)
    assert [le for le, _ in out] == [*prom._LE, "+Inf"]
    counts = [c for _, c in out]
    assert counts == sorted(counts)  # cumulative: never decreasing
    assert counts[0] == 2 and counts[3] == 7 and counts[-2] == 7 and counts[-1] == 8


def test_every_column_is_documented() -> None:
    text = DOCS.read_text()
    for table, cols in COLUMNS.items():
        m = re.search(rf"^#### `{table}`\n(.*?)(?=^#|\Z)", text, re.M | re.S)
        assert m, f"docs/observing.md has no '#### `{table}`' section"
        documented = re.findall(r"^\| `(\w+)` \|", m.group(1), re.M)
        assert documented == [c for c, _, _ in cols], f"docs/observing.md: table {table}"


def test_serve_checks_its_port() -> None:
    with pytest.raises(ValueError, match="port must be an int"):
        danaus.dashboard.serve(port=-1)
