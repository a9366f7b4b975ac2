"""Prometheus: ``danaus.telemetry.serve_metrics`` and the dashboard's ``/metrics``, scraped
by a real Prometheus server (Debian's ``prometheus``, started here with a scrape
configuration of its own; ``scripts/install-services`` installs it)."""

from __future__ import annotations

import json
import math
import os
import pathlib
import random
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

import danaus.dashboard
from danaus import telemetry
from danaus._actor.api.procs import owned_proc_meshes
from danaus._runtime.messaging.metrics import BOUNDS
from danaus._runtime.node import this_node
from danaus.actor import Actor, ActorError, ProcMesh, endpoint, this_host
from danaus.testing import wait_until

from .conftest import REPLY_TIMEOUT, Worker

# Prometheus's scrape interval and timeout here: a scrape asks every proc of the client (a
# STATS round, each proc given stats_timeout, 2 s), so a loaded machine needs the margin.
SCRAPE_S = 5.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _prometheus_binary() -> str:
    exe = shutil.which("prometheus") or "/usr/bin/prometheus"
    if not os.access(exe, os.X_OK):
        pytest.fail(
            "Prometheus is not installed: run scripts/install-services as root "
            "(apt-get install prometheus)"
        )
    return exe


class Prometheus:
    """A Prometheus server scraping ``targets`` (job name -> (url, bearer token or None))."""

    def __init__(self, tmp: pathlib.Path, targets: dict[str, tuple[str, str | None]]) -> None:
        exe = _prometheus_binary()
        lines = [
            "global:",
            f"  scrape_interval: {int(SCRAPE_S * 1000)}ms",
            f"  scrape_timeout: {int(SCRAPE_S * 1000)}ms",
            "scrape_configs:",
        ]
        for job, (url, token) in targets.items():
            parts = urllib.parse.urlsplit(url)
            lines += [
                f"  - job_name: {job}",
                f"    metrics_path: {parts.path}",
                "    static_configs:",
                f"      - targets: ['{parts.netloc}']",
            ]
            if token:
                (tmp / f"{job}.token").write_text(token)
                (tmp / f"{job}.token").chmod(0o600)
                lines += [
                    "    authorization:",
                    f"      credentials_file: {tmp / f'{job}.token'}",
                ]
        (tmp / "prometheus.yml").write_text("\n".join(lines) + "\n")
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp / "prometheus.log"
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [
                    exe,
                    f"--config.file={tmp / 'prometheus.yml'}",
                    f"--storage.tsdb.path={tmp / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        wait_until(self._ready, timeout=60, what=f"Prometheus to start (log: {self.log})")

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            pytest.fail(f"Prometheus exited with {self.proc.returncode}:\n{self.log.read_text()}")
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=5) as r:
                return bool(r.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def query(self, promql: str) -> list[dict[str, Any]]:
        q = urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(f"{self.url}/api/v1/query?{q}", timeout=10) as r:
            answer = json.load(r)
        assert answer["status"] == "success", answer
        return list(answer["data"]["result"])

    def value(self, promql: str) -> float | None:
        result = self.query(promql)
        return float(result[0]["value"][1]) if result else None

    def targets_up(self) -> dict[str, str]:
        with urllib.request.urlopen(f"{self.url}/api/v1/targets", timeout=10) as r:
            answer = json.load(r)
        return {
            t["labels"]["job"]: f"{t['health']} {t['lastError']}"
            for t in answer["data"]["activeTargets"]
        }

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def metrics_server() -> Iterator[telemetry.MetricsServer]:
    server = telemetry.serve_metrics(port=0, token="s3cret-token")
    yield server
    server.stop()


@pytest.fixture
def prometheus(
    tmp_path: pathlib.Path,
    metrics_server: telemetry.MetricsServer,
    dashboard: danaus.dashboard.Dashboard,
) -> Iterator[Prometheus]:
    dash = urllib.parse.urlsplit(dashboard.url)
    prom = Prometheus(
        tmp_path,
        {
            "danaus": (metrics_server.url, "s3cret-token"),
            "dashboard": (f"http://{dash.netloc}/metrics", dashboard.token),
        },
    )
    yield prom
    prom.stop()


@pytest.mark.timeout(180)
def test_prometheus_scrapes_calls_errors_and_latencies_per_mesh_endpoint_and_rank(
    procs: ProcMesh, prometheus: Prometheus
) -> None:
    mesh = procs.spawn("scraped", Worker)
    for _ in range(6):
        mesh.slice(gpus=1).ping.call_one(b"x" * 10_000).get(timeout=REPLY_TIMEOUT)
    mesh.ping.call().get(timeout=REPLY_TIMEOUT)
    for _ in range(2):
        with pytest.raises(ActorError):
            mesh.slice(gpus=0).boom.call_one().get(timeout=REPLY_TIMEOUT)

    rt = this_node().runtime
    want = {
        'danaus_endpoint_calls_total{job="danaus",mesh="scraped",endpoint="ping",rank="1"}': 7,
        'danaus_endpoint_calls_total{job="danaus",mesh="scraped",endpoint="ping",rank="0"}': 1,
        'danaus_endpoint_errors_total{job="danaus",mesh="scraped",endpoint="boom",rank="0"}': 2,
        'danaus_endpoint_latency_seconds_count{job="danaus",mesh="scraped",rank="1"}': 7,
        'danaus_endpoint_latency_seconds_bucket{job="danaus",mesh="scraped",rank="1",le="+Inf"}': 7,
        # The dashboard serves the same numbers.
        'danaus_endpoint_calls_total{job="dashboard",mesh="scraped",endpoint="ping",rank="1"}': 7,
        # Every live proc this client spawned (other test modules' meshes may still run).
        'sum(danaus_procs{job="danaus",state="alive"})': len(
            {
                p.name
                for pm in owned_proc_meshes()
                for p in pm._procs
                if not rt.peers.is_lost(p.name)
            }
        ),
        'count(danaus_actor_queue_depth{job="danaus",mesh="scraped"})': 2,
    }

    def seen() -> dict[str, Any]:
        return {**{q: prometheus.value(q) for q in want}, "targets": prometheus.targets_up()}

    wait_until(
        seen,
        timeout=120,
        what="Prometheus to scrape the counts the test made",
        until=lambda got: all(got[q] == v for q, v in want.items()),
        interval=0.5,
    )
    assert prometheus.targets_up() == {"danaus": "up ", "dashboard": "up "}
    # The call's 10 kB arguments count in the bytes the client sent.
    sent = prometheus.value('sum(danaus_proc_sent_bytes_total{job="danaus"})')
    assert sent is not None and sent > 60_000
    # Every ping fell into some bucket at or below the largest finite bound.
    finite = prometheus.query(
        'danaus_endpoint_latency_seconds_bucket{job="danaus",mesh="scraped",endpoint="ping",'
        f'rank="1",le="{BOUNDS[-1]:.6g}"}}'
    )
    assert [float(r["value"][1]) for r in finite] == [7.0]


def test_the_metrics_endpoint_wants_its_token_and_serves_the_text_format(
    metrics_server: telemetry.MetricsServer,
) -> None:
    assert metrics_server.url.startswith("http://127.0.0.1:")
    assert metrics_server.url.endswith("/metrics")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(metrics_server.url, timeout=10)
    assert e.value.code == 401
    e.value.close()
    request = urllib.request.Request(
        metrics_server.url, headers={"Authorization": "Bearer s3cret-token"}
    )
    with urllib.request.urlopen(request, timeout=30) as r:
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        body = r.read().decode()
    assert "# TYPE danaus_endpoint_calls_total counter" in body
    assert "# TYPE danaus_endpoint_latency_seconds histogram" in body
    assert "# TYPE danaus_procs gauge" in body


def test_serve_metrics_refuses_bad_arguments() -> None:
    with pytest.raises(ValueError, match="port"):
        telemetry.serve_metrics(port=70000)
    with pytest.raises(ValueError, match="token"):
        telemetry.serve_metrics(token="")
    with pytest.raises(ValueError, match="host"):
        telemetry.serve_metrics(host="")


class Timed(Actor):
    """Sleeps as told and says how long it slept, as measured in the actor."""

    @endpoint
    def hold(self, seconds: float) -> float:
        t0 = time.perf_counter()
        time.sleep(seconds)
        return time.perf_counter() - t0


def _true_quantile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


@pytest.mark.timeout(240)
def test_a_real_prometheus_reports_latency_quantiles_within_10_percent_of_the_actors(
    prometheus: Prometheus,
) -> None:
    # 4 ranks, 320 calls of lognormal durations around 4 ms: the quantiles PromQL reads from
    # the exported buckets are within 10% of the same quantiles of what the actors measured.
    pm = this_host().spawn_procs(per_host={"gpus": 4})
    try:
        mesh = pm.spawn("quantiled", Timed)
        rng = random.Random(41)
        draws = [
            min(0.05, max(0.0005, rng.lognormvariate(math.log(4e-3), 0.5))) for _ in range(320)
        ]
        ranks = [mesh.slice(gpus=g) for g in range(4)]
        measured: list[float] = []
        for start in range(0, len(draws), 4):  # one call per rank at a time
            futs = [ranks[g].hold.call_one(d) for g, d in enumerate(draws[start : start + 4])]
            measured += [f.get(timeout=REPLY_TIMEOUT) for f in futs]
        count = 'sum(danaus_endpoint_latency_seconds_count{job="danaus",mesh="quantiled"})'
        wait_until(
            lambda: prometheus.value(count),
            timeout=120,
            what="Prometheus to scrape every call",
            until=lambda n: n == len(draws),
            interval=0.5,
        )
        buckets = (
            'sum by (le) (danaus_endpoint_latency_seconds_bucket{job="danaus",mesh="quantiled",'
            'endpoint="hold"})'
        )
        for q in (0.5, 0.9, 0.99):
            got = prometheus.value(f"histogram_quantile({q}, {buckets})")
            want = _true_quantile(measured, q)
            assert got is not None and abs(got - want) / want < 0.10, (q, got, want)
    finally:
        pm.stop().get(timeout=REPLY_TIMEOUT)
