"""``danaus.telemetry.query``: SQL over the actors, messages, spans and metrics of a live mesh,
compared with what each test did; and ``danaus query`` on the command line."""

from __future__ import annotations

import itertools
import subprocess
import sys
import time

import pytest

import danaus.dashboard
from danaus import telemetry
from danaus._runtime.messaging.metrics import Recent
from danaus._runtime.node import this_node
from danaus.actor import Actor, ActorError, ProcMesh, endpoint
from danaus.testing import FaultRecorder, client_env, wait_until

from .conftest import REPLY_TIMEOUT, Worker, proc_names


class Spanner(Actor):
    """Records a span of its own in its proc's ring."""

    @endpoint
    def work(self, name: str) -> None:
        rt = this_node().runtime
        assert rt.observing.recent is not None
        t0 = time.perf_counter_ns()
        rt.observing.recent.span(
            name, t0, t0 + 5_000_000, "spanner[0]", "ab" * 16, "cd" * 8, None, {"k": 1}
        )


def test_n_calls_to_an_endpoint_give_n_message_rows_with_their_sizes_and_times(
    procs: ProcMesh,
) -> None:
    mesh = procs.spawn("queried", Worker)
    for i in range(7):
        mesh.slice(gpus=1).ping.call_one("x" * 1000 * (i + 1)).get(timeout=REPLY_TIMEOUT)
    mesh.ping.call(None).get(timeout=REPLY_TIMEOUT)  # one more on each rank
    with pytest.raises(ActorError):
        mesh.slice(gpus=0).boom.call_one().get(timeout=REPLY_TIMEOUT)

    rows = telemetry.query(
        "SELECT rank, endpoint, count(*) AS n, sum(CASE WHEN ok THEN 0 ELSE 1 END) AS failed "
        "FROM messages WHERE mesh = 'queried' GROUP BY rank, endpoint ORDER BY rank, endpoint"
    )
    assert rows == [
        {"rank": 0, "endpoint": "boom", "n": 1, "failed": 1},
        {"rank": 0, "endpoint": "ping", "n": 1, "failed": 0},
        {"rank": 1, "endpoint": "ping", "n": 8, "failed": 0},
    ]
    [name1] = proc_names(procs.slice(gpus=1))
    big = telemetry.query(
        "SELECT * FROM messages WHERE mesh = 'queried' AND rank = 1 ORDER BY arrived"
    )
    assert [r["proc"] for r in big] == [name1] * 8
    assert all(r["receiver"] == "queried[1]" and r["sample_rate"] == 1.0 for r in big)
    client = this_node().runtime.proc_id.name
    assert all(r["sender"] == client for r in big)  # the client's main thread called
    # Each call carried its argument: 1000 bytes more each time; each got a reply.
    sizes = [r["request_bytes"] for r in big[:7]]
    assert [b - a for a, b in itertools.pairwise(sizes)] == [1000] * 6
    assert all(r["reply_bytes"] > 1000 * (i + 1) for i, r in enumerate(big[:7]))
    for r in big:
        assert r["arrived"] <= r["started"] <= r["ended"]
        assert r["queued_s"] == pytest.approx(r["started"] - r["arrived"], abs=1e-3)
        assert r["handled_s"] == pytest.approx(r["ended"] - r["started"], abs=1e-3)


def test_the_actors_table_lists_live_stopped_and_failed_actors(
    procs: ProcMesh, faults: FaultRecorder
) -> None:
    mesh = procs.spawn("listed", Worker)
    mesh.initialized.get(timeout=REPLY_TIMEOUT)
    names = proc_names(procs)
    rows = telemetry.query(
        "SELECT rank, class, proc, state, stopped, failure FROM actors "
        "WHERE mesh = 'listed' ORDER BY rank"
    )
    assert rows == [
        {"rank": r, "class": "Worker", "proc": names[r], "state": "idle", "stopped": None,
         "failure": None}
        for r in range(2)
    ]  # fmt: skip
    gone = procs.spawn("gone", Worker)
    gone.initialized.get(timeout=REPLY_TIMEOUT)
    gone.stop().get(timeout=REPLY_TIMEOUT)
    wait_until(
        lambda: [r["state"] for r in telemetry.query(
            "SELECT state FROM actors WHERE mesh = 'gone' ORDER BY rank")] == ["stopped"] * 2,
        timeout=REPLY_TIMEOUT,
        what="the stopped actors to show as stopped",
    )  # fmt: skip
    [row] = telemetry.query("SELECT started, stopped FROM actors WHERE mesh = 'gone' AND rank = 0")
    assert row["started"] <= row["stopped"]


def test_spans_an_actor_records_are_a_table_too(procs: ProcMesh) -> None:
    mesh = procs.spawn("spanner", Spanner).slice(gpus=0)
    mesh.work.call_one("s1").get(timeout=REPLY_TIMEOUT)
    [row] = telemetry.query("SELECT * FROM spans WHERE name = 's1'")
    assert row["actor"] == "spanner[0]" and row["trace_id"] == "ab" * 16
    assert row["parent_id"] is None and row["attributes"] == '{"k": 1}'
    assert row["duration_s"] == pytest.approx(0.005)
    assert row["ended"] - row["started"] == pytest.approx(0.005, abs=1e-6)


def test_the_metrics_table_holds_each_endpoints_counters(procs: ProcMesh) -> None:
    mesh = procs.spawn("counted", Worker)
    for _ in range(5):
        mesh.ping.call().get(timeout=REPLY_TIMEOUT)
    rows = telemetry.query(
        "SELECT rank, value FROM metrics WHERE mesh = 'counted' AND endpoint = 'ping' "
        "AND name = 'calls' ORDER BY rank"
    )
    assert rows == [{"rank": 0, "value": 5.0}, {"rank": 1, "value": 5.0}]
    [sent] = telemetry.query(
        "SELECT sum(value) AS b FROM metrics WHERE name = 'bytes_sent' AND mesh IS NULL"
    )
    assert sent["b"] > 0
    # a query naming only the metrics table still has each proc's messages_seen
    seen = telemetry.query("SELECT proc, value FROM metrics WHERE name = 'messages_seen'")
    assert {row["proc"] for row in seen} >= set(proc_names(procs))
    assert sum(row["value"] for row in seen) >= 10  # the 5 calls to 2 ranks at least


def test_bad_sql_says_why_and_lists_the_tables() -> None:
    with pytest.raises(telemetry.QueryError, match=r"(?s)nosuch.*messages\(mesh, mesh_id"):
        telemetry.query("SELECT * FROM nosuch")
    with pytest.raises(telemetry.QueryError, match="empty"):
        telemetry.query("  ")
    with pytest.raises(TypeError, match="str"):
        telemetry.query(42)  # type: ignore[arg-type]
    # The database holds the tables only: no file is read.
    with pytest.raises(telemetry.QueryError, match=r"(?i)disabled|permission"):
        telemetry.query("SELECT * FROM read_csv('/etc/hostname')")


def test_busy_procs_sample_messages_and_say_at_what_rate() -> None:
    now = [0]
    step = [100_000_000]  # 0.1 s between two rate checks (CHECK_EVERY messages)

    def clock() -> int:
        now[0] += step[0]
        return now[0]

    n = Recent.CHECK_EVERY
    ring = Recent(size=50, per_s=100, clock=clock)
    first = [ring.take() for _ in range(n)]
    assert first[:-1] == [1] * (n - 1)  # all recorded until the rate is known
    busy = [ring.take() for _ in range(n * 10)]  # 1280 a second, 100 allowed: 1 in 13
    assert ring.stride == 13
    kept = [s for s in busy if s]
    assert set(kept) == {13} and len(kept) * 13 == pytest.approx(len(busy), abs=13 * 2)
    step[0] = 100_000_000_000  # quiet again: 1.28 a second
    [ring.take() for _ in range(n)]
    assert ring.stride == 1 and [ring.take() for _ in range(5)] == [1] * 5
    for i in range(80):
        ring.messages.append([i])
    assert len(ring.messages) == 50  # the ring is bounded
    with pytest.raises(ValueError, match="at least 1"):
        Recent(size=0, per_s=10)


def test_danaus_query_prints_a_table(
    dashboard: danaus.dashboard.Dashboard, procs: ProcMesh
) -> None:
    mesh = procs.spawn("climesh", Worker)
    for _ in range(4):
        mesh.ping.call().get(timeout=REPLY_TIMEOUT)
    out = subprocess.run(
        [sys.executable, "-m", "danaus", "query", "--url", dashboard.url,
         "SELECT endpoint, count(*) AS n FROM messages WHERE mesh = 'climesh' GROUP BY endpoint"],
        env=client_env(), capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["endpoint", "n"]
    assert lines[2].split() == ["ping", "8"]
    assert lines[-1] == "(1 row)"
    bad = subprocess.run(
        [sys.executable, "-m", "danaus", "query", "--url", dashboard.url, "SELEC 1"],
        env=client_env(), capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    assert bad.returncode == 2 and "syntax error" in bad.stderr
