"""Issue 41: telemetry that tells the truth. Spans of endpoints and of user code in the
spans table, Prometheus histograms fine enough for quantiles within 10 %, endpoint series
labelled with the actor's class and the proc mesh (and bounded), the built-in endpoint
metrics over OpenTelemetry, and Monarch's ``query_engine_client`` and ``dashboard_url``."""

from __future__ import annotations

import json
import logging
import math
import os
import pathlib
import random
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from danaus import config, telemetry
from danaus._observe import prom
from danaus._runtime.messaging.metrics import BOUNDS, EndpointStats
from danaus.actor import Actor, ProcMesh, endpoint, span, this_host

from .conftest import REPLY_TIMEOUT, Worker

SRC = pathlib.Path(__file__).resolve().parents[2] / "src"


class Spanning(Actor):
    """Runs a user span inside an endpoint."""

    @endpoint
    def load(self, name: str) -> int:
        with span(name):
            return 1


# -- spans ------------------------------------------------------------------------------


def test_endpoint_calls_are_spans_of_the_spans_table(procs: ProcMesh) -> None:
    mesh = procs.spawn("spanned", Worker)
    for _ in range(3):
        mesh.slice(gpus=1).ping.call_one(None).get(timeout=REPLY_TIMEOUT)
    with pytest.raises(Exception, match="boom on purpose"):
        mesh.slice(gpus=0).boom.call_one().get(timeout=REPLY_TIMEOUT)
    rows = telemetry.query(
        "SELECT name, actor, duration_s, started, ended, attributes FROM spans "
        "WHERE actor LIKE 'spanned[%' ORDER BY actor, started"
    )
    assert [(r["name"], r["actor"]) for r in rows] == [("Worker.boom", "spanned[0]")] + [
        ("Worker.ping", "spanned[1]")
    ] * 3
    assert [json.loads(r["attributes"])["ok"] for r in rows] == [False, True, True, True]
    for r in rows:
        assert r["started"] <= r["ended"] and r["duration_s"] >= 0
        assert json.loads(r["attributes"])["class"] == "Worker"


def test_user_spans_inside_an_endpoint_are_spans_of_the_spans_table(procs: ProcMesh) -> None:
    mesh = procs.spawn("userspans", Spanning).slice(gpus=0)
    assert mesh.load.call_one("loading-weights").get(timeout=REPLY_TIMEOUT) == 1
    [row] = telemetry.query("SELECT * FROM spans WHERE name = 'loading-weights'")
    assert row["actor"] == "userspans[0]"
    attrs = json.loads(row["attributes"])
    assert attrs["endpoint"] == "load" and attrs["kind"] == "user"
    [outer] = telemetry.query("SELECT * FROM spans WHERE name = 'Spanning.load'")
    # the user's span ran inside the endpoint's
    assert outer["started"] <= row["started"] <= row["ended"] <= outer["ended"]


# -- Prometheus histograms ----------------------------------------------------------------


def _histogram_quantile(q: float, buckets: list[tuple[str, float]]) -> float:
    """Prometheus's ``histogram_quantile``: linear interpolation within the bucket the
    rank falls in (the first bucket's lower bound is 0)."""
    total = buckets[-1][1]
    rank = q * total
    lo, below = 0.0, 0.0
    for le, cum in buckets:
        if cum >= rank:
            if le == "+Inf":
                return lo
            hi = float(le)
            return lo + (hi - lo) * (rank - below) / (cum - below)
        lo, below = float(le), cum
    raise AssertionError("unreachable")  # pragma: no cover


def _true_quantile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[max(0, math.ceil(q * len(s)) - 1)]


@pytest.mark.parametrize(
    "name,draw",
    [
        ("lognormal around 2 ms", lambda r: r.lognormvariate(math.log(2e-3), 0.6)),
        ("uniform 10-50 us", lambda r: r.uniform(10e-6, 50e-6)),
        ("exponential, 30 ms mean", lambda r: 1e-5 + r.expovariate(1 / 30e-3)),
        ("two modes", lambda r: r.choice([r.gauss(150e-6, 5e-6), r.gauss(4e-3, 2e-4)])),
        # the worst case: every latency the same, just above a bucket's lower bound
        ("one value", lambda r: BOUNDS[80] * 1.0001),
    ],
)
def test_quantiles_read_from_the_exported_buckets_are_within_10_percent(
    name: str, draw: Any
) -> None:
    rng = random.Random(41)
    values = [draw(rng) for _ in range(20_000)]
    st = EndpointStats()
    for v in values:
        st.record(v, True)
    snap = st.snapshot()
    buckets = prom._cumulative(snap["buckets"], snap["calls"])
    for q in (0.5, 0.9, 0.95, 0.99):
        want = _true_quantile(values, q)
        got = _histogram_quantile(q, buckets)
        assert abs(got - want) / want < 0.10, (name, q, got, want)


# -- Prometheus labels and their bound -----------------------------------------------------


def _families(body: bytes) -> dict[str, Any]:
    from prometheus_client.parser import text_string_to_metric_families

    return {f.name: f for f in text_string_to_metric_families(body.decode())}


@pytest.fixture(scope="module")
def named_procs() -> Iterator[ProcMesh]:
    pm = this_host().spawn_procs(per_host={"gpus": 1}, name="trainers")
    pm.initialized.get(timeout=REPLY_TIMEOUT)
    yield pm
    pm.stop().get(timeout=REPLY_TIMEOUT)


def test_endpoint_series_carry_the_actor_class_and_the_proc_mesh(named_procs: ProcMesh) -> None:
    mesh = named_procs.spawn("labelled", Worker)
    for _ in range(3):
        mesh.ping.call_one(None).get(timeout=REPLY_TIMEOUT)
    fams = _families(prom.exposition())
    calls = [s for s in fams["danaus_endpoint_calls"].samples if s.labels.get("mesh") == "labelled"]
    assert [(s.labels, s.value) for s in calls] == [
        (
            {"mesh": "labelled", "class": "Worker", "proc_mesh": "trainers", "endpoint": "ping",
             "rank": "0"},
            3.0,
        )
    ]  # fmt: skip
    les = [
        s.labels["le"]
        for s in fams["danaus_endpoint_latency_seconds"].samples
        if s.name.endswith("_bucket") and s.labels.get("mesh") == "labelled"
    ]
    assert len(les) == len(BOUNDS) + 1  # every fine bound, and +Inf


def test_series_beyond_metrics_max_series_are_dropped_counted_and_warned_once(
    named_procs: ProcMesh, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    mesh = named_procs.spawn("capped", Worker)
    mesh.ping.call_one(None).get(timeout=REPLY_TIMEOUT)
    mesh.pid.call_one().get(timeout=REPLY_TIMEOUT)
    before = _families(prom.exposition())
    n = len({tuple(sorted(s.labels.items())) for s in before["danaus_endpoint_calls"].samples})
    assert n >= 2
    monkeypatch.setattr(prom, "_warned_series", False)
    caplog.set_level(logging.WARNING, logger="danaus.telemetry")
    with config.configured(metrics_max_series=1):
        for _ in range(2):
            fams = _families(prom.exposition())
            kept = {tuple(sorted(s.labels.items())) for s in fams["danaus_endpoint_calls"].samples}
            assert len(kept) == 1
            [dropped] = fams["danaus_metrics_dropped_series"].samples
            assert dropped.value == n - 1
    warned = [r for r in caplog.records if "metrics_max_series" in r.getMessage()]
    assert len(warned) == 1


# -- subprocesses: OpenTelemetry's providers and the job's telemetry are process-wide -----


def _run(code: str) -> str:
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(SRC)},
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-6000:]
    return r.stdout.strip().splitlines()[-1]


_OTEL = """
import json
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
reader = InMemoryMetricReader()
metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
from danaus._actor.core import telemetry
from danaus.actor import Actor, endpoint, this_proc, shutdown_context
telemetry.enable()

class W(Actor):
    @endpoint
    def ping(self) -> int:
        return 1

    @endpoint
    def boom(self) -> None:
        raise ValueError("no")

m = this_proc().spawn("otelw", W)
for _ in range(5):
    m.ping.call_one().get(timeout=60)
try:
    m.boom.call_one().get(timeout=60)
except Exception:
    pass
out = {}
for rm in reader.get_metrics_data().resource_metrics:
    for sm in rm.scope_metrics:
        for metric in sm.metrics:
            for p in metric.data.data_points:
                a = dict(p.attributes)
                if a.get("danaus.mesh") != "otelw":
                    continue
                key = metric.name + "/" + a["danaus.endpoint"]
                if hasattr(p, "bucket_counts"):
                    out[key] = [p.count, a["danaus.actor.class"], len(p.explicit_bounds)]
                else:
                    out[key] = p.value
shutdown_context().get()
print(json.dumps(out, sort_keys=True))
"""


@pytest.mark.timeout(150)
def test_endpoint_metrics_are_opentelemetry_instruments() -> None:
    got = json.loads(_run(_OTEL))
    assert got == {
        "danaus.endpoint.calls/ping": 5,
        "danaus.endpoint.calls/boom": 1,
        "danaus.endpoint.errors/boom": 1,
        "danaus.endpoint.errors/ping": 0,
        "danaus.endpoint.latency/ping": [5, "W", len(BOUNDS)],
        "danaus.endpoint.latency/boom": [1, "W", len(BOUNDS)],
    }


_JOB = """
import json, urllib.request
from danaus.actor import Actor, endpoint
from danaus.job import LocalJob, TelemetryConfig

class W(Actor):
    @endpoint
    def ping(self) -> int:
        return 1

job = LocalJob().enable_telemetry(TelemetryConfig(include_dashboard=True, dashboard_port=0))
state = job.state(cached_path=None)
url = state.dashboard_url
with urllib.request.urlopen(url, timeout=30) as r:
    status = r.status
procs = state.hosts.spawn_procs(per_host={"gpus": 2})
m = procs.spawn("queried", W)
m.ping.call().get(timeout=60)
answer = state.query_engine_client.query(  # Monarch's tables and answer
    "SELECT a.rank, m.class FROM actors a JOIN meshes m ON a.mesh_id = m.id "
    "WHERE m.given_name = 'queried' ORDER BY a.rank"
)
again = job.state(cached_path=None)
print(json.dumps({"url": url, "status": status, "answer": answer,
                  "same": [again.dashboard_url == url,
                           again.query_engine_client is state.query_engine_client]}))
procs.stop().get(timeout=60)
job.kill()
"""


@pytest.mark.timeout(150)
def test_a_job_with_telemetry_has_monarchs_query_client_and_dashboard_url() -> None:
    got = json.loads(_run(_JOB))
    assert got["url"].startswith("http://127.0.0.1:")
    assert got["status"] == 200
    assert got["answer"] == {
        "columns": ["rank", "class"],
        "rows": [{"rank": 0, "class": "Python<W>"}, {"rank": 1, "class": "Python<W>"}],
    }
    assert got["same"] == [True, True]
