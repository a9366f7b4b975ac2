"""Monarch's telemetry API (``span``, ``traced``, ``get_meter``, ``TelemetryConfig``,
``enable_telemetry``) and OpenTelemetry export (issue 29, parts 1 and 4).

The mesh scenarios run ``telemetry_client.py`` in a process of its own, since
OpenTelemetry's providers are set once per process: with in-memory exporters (the
client's own, and one per proc read back through an actor), and over OTLP/HTTP to a
receiver this test runs, reading the protobuf requests with OpenTelemetry's own
definitions (``opentelemetry-proto``).
"""

from __future__ import annotations

import asyncio
import gzip
import http.server
import json
import os
import subprocess
import sys
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import danaus
import danaus.actor
import danaus.job
from danaus._actor.core import telemetry
from danaus._config import NoEffectWarning
from danaus._wire import protocol
from danaus.actor import Actor, ProcMesh, endpoint
from danaus.job import LocalJob, TelemetryConfig
from danaus.testing import wait_until

from .conftest import REPLY_TIMEOUT

CLIENT = Path(__file__).with_name("telemetry_client.py")
SRC = Path(danaus.actor.__file__).resolve().parents[1]


def _run_client(scenario: str, env: dict[str, str] | None = None) -> str:
    r = subprocess.run(
        [sys.executable, str(CLIENT), scenario],
        capture_output=True,
        text=True,
        timeout=150,
        env={**os.environ, "PYTHONPATH": str(SRC), **(env or {})},
        cwd=CLIENT.parent,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-6000:]
    return r.stdout


def _check_the_tree(spans: list[dict[str, Any]]) -> None:
    """The spans of ``telemetry_client.client_step``: one trace, every endpoint's span
    a child of the client's, the nested call's a child of the actor's ``ponder``."""
    by_name: dict[str, list[dict[str, Any]]] = {}
    for s in spans:
        by_name.setdefault(s["name"], []).append(s)
    [root] = by_name.pop("client_step")
    assert root["parent"] is None
    assert {s["trace"] for s in spans} == {root["trace"]}
    [ponder] = by_name["ponder"]
    [think] = by_name["think"]
    assert ponder["parent"] == think["id"] and think["parent"] == root["id"]
    eats = by_name["eat"]
    # pair.call (2), the nested call (1), wide.call down the cast tree (4), wide[3] (1)
    assert len(eats) == 8
    nested = [s for s in eats if s["parent"] == ponder["id"]]
    assert len(nested) == 1 and nested[0]["attributes"]["danaus.rank"] == 1
    assert all(s["parent"] == root["id"] for s in eats if s is not nested[0])
    wide = sorted(
        s["attributes"]["danaus.rank"] for s in eats if s["attributes"]["danaus.mesh"] == "wide"
    )
    assert wide == [0, 1, 2, 3, 3]
    for s in eats:
        a = s["attributes"]
        assert s["kind"] == "SERVER" and s["status"] == "UNSET"
        assert a["danaus.endpoint"] == "eat" and a["rpc.method"] == "eat"
        assert a["rpc.service"] == a["danaus.actor.class"] == "Philosopher"
        assert a["danaus.actor"].endswith(f"[{a['danaus.rank']}]") and a["danaus.proc"]
    # each span made inside an endpoint carries the actor, and is the endpoint's child
    chews = by_name["chew"]
    assert len(chews) == 8
    ids = {s["id"]: s for s in eats}
    for c in chews:
        parent = ids[c["parent"]]
        for key in ("danaus.actor", "danaus.rank", "danaus.mesh", "danaus.endpoint"):
            assert c["attributes"][key] == parent["attributes"][key]
    assert ponder["attributes"]["danaus.mesh"] == "thinker"
    assert ponder["attributes"]["danaus.endpoint"] == "think"
    [fail] = by_name["fail"]
    assert fail["status"] == "ERROR" and "exception" in fail["events"]
    assert fail["parent"] == root["id"]
    assert "untraced" not in by_name  # called outside any span
    # @endpoint(instrument=False): no span of its own, the caller's context current
    assert "quiet" not in by_name
    [hush] = by_name["hush"]
    assert hush["parent"] == root["id"] and hush["attributes"]["danaus.endpoint"] == "quiet"
    assert set(by_name) == {"ponder", "think", "eat", "chew", "fail", "hush"}


@pytest.mark.timeout(180)
def test_endpoint_spans_nest_under_the_callers_span_in_memory_exporters() -> None:
    out = _run_client("memory")
    doc = json.loads(out.strip().splitlines()[-1])
    _check_the_tree(doc["spans"])


# -- OTLP over HTTP, to a receiver of ours --------------------------------------------


class _Receiver:
    """An OTLP/HTTP receiver: keeps every span and metric data point posted to it."""

    def __init__(self) -> None:
        from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

        self.lock = threading.Lock()
        self.spans: list[dict[str, Any]] = []
        self.points: list[tuple[str, str, int]] = []  # (proc, metric, value)
        self.services: set[str] = set()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path == "/v1/traces":
                    req = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
                    receiver.add_spans(req)
                    answer = trace_service_pb2.ExportTraceServiceResponse()
                elif self.path == "/v1/metrics":
                    mreq = metrics_service_pb2.ExportMetricsServiceRequest.FromString(body)
                    receiver.add_metrics(mreq)
                    answer = metrics_service_pb2.ExportMetricsServiceResponse()  # type: ignore[assignment]
                else:
                    self.send_error(404)
                    return
                data = answer.SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @staticmethod
    def _attrs(kvs: Any) -> dict[str, Any]:
        out = {}
        for kv in kvs:
            v = kv.value
            out[kv.key] = getattr(v, v.WhichOneof("value")) if v.WhichOneof("value") else None
        return out

    def add_spans(self, req: Any) -> None:
        with self.lock:
            for rs in req.resource_spans:
                self.services.add(self._attrs(rs.resource.attributes)["service.name"])
                for ss in rs.scope_spans:
                    for s in ss.spans:
                        self.spans.append(
                            {
                                "name": s.name,
                                "trace": s.trace_id.hex(),
                                "id": s.span_id.hex(),
                                "parent": s.parent_span_id.hex() or None,
                                "kind": {1: "INTERNAL", 2: "SERVER"}.get(s.kind, str(s.kind)),
                                "status": {0: "UNSET", 1: "OK", 2: "ERROR"}[s.status.code],
                                "attributes": self._attrs(s.attributes),
                                "events": [e.name for e in s.events],
                            }
                        )

    def add_metrics(self, req: Any) -> None:
        with self.lock:
            for rm in req.resource_metrics:
                proc = str(self._attrs(rm.resource.attributes).get("danaus.proc"))
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        for p in m.sum.data_points:
                            self.points.append((proc, m.name, p.as_int))

    def meals(self) -> int:
        """The last cumulative count of ``meals`` each proc exported, added up."""
        with self.lock:
            last = {proc: v for proc, name, v in self.points if name == "meals"}
        return sum(last.values())

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[_Receiver]:
    r = _Receiver()
    try:
        yield r
    finally:
        r.close()


def _wait_for_exports(receiver: _Receiver) -> None:
    """Until 20 spans and the 8 meals have come; else fail saying what did come."""

    def seen() -> str:
        with receiver.lock:
            last = {proc: v for proc, name, v in receiver.points if name == "meals"}
            return f"{len(receiver.spans)} spans, meals per proc {last}"

    try:
        wait_until(lambda: len(receiver.spans) >= 20 and receiver.meals() == 8, timeout=60)
    except AssertionError as e:
        raise AssertionError(f"{e}; exported: {seen()}") from None


@pytest.mark.timeout(180)
def test_spans_and_metrics_of_every_process_are_exported_over_otlp(receiver: _Receiver) -> None:
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        "OTEL_SERVICE_NAME": "philosophers",
        "OTEL_BSP_SCHEDULE_DELAY": "50",
        "OTEL_METRIC_EXPORT_INTERVAL": "200",
    }
    _run_client("otlp", env)
    # The procs export in their own processes, as they run and when they exit.
    _wait_for_exports(receiver)
    with receiver.lock:
        spans = list(receiver.spans)
    _check_the_tree(spans)
    assert receiver.services == {"philosophers"}
    assert receiver.meals() == 8


# -- the API, in this process (nothing here turns telemetry on) -------------------------


def test_span_and_traced_work_as_context_manager_and_decorators() -> None:
    with danaus.actor.span("outside") as s:
        assert s.name == "outside"
        s.set_attribute("k", 1)  # a no-op: this process has no tracer provider
        s.add_event("e")
    with pytest.raises(RuntimeError, match="already running"), s, s:
        pass

    @danaus.actor.traced
    def add(a: int, b: int = 1) -> int:
        return a + b

    @danaus.actor.traced(name="named")
    async def twice(x: int) -> int:
        return 2 * x

    assert add(1, b=2) == 3 and add.__name__ == "add"
    assert asyncio.run(twice(4)) == 8 and twice.__name__ == "twice"
    with pytest.raises(TypeError, match="non-empty string"):
        danaus.actor.span("")
    with pytest.raises(TypeError, match="decorates a function"):
        danaus.actor.traced(3)  # type: ignore[call-overload]
    assert telemetry.outgoing() is None  # no span is current: nothing to carry


def test_an_exception_leaving_a_span_propagates() -> None:
    with pytest.raises(KeyError), danaus.actor.span("failing"):
        raise KeyError("x")


def test_get_meter_is_the_danaus_meter_and_its_instruments_record() -> None:
    meter = danaus.actor.get_meter()
    meter.create_counter("c").add(1, {"a": "b"})
    meter.create_histogram("h").record(0.5)
    meter.create_up_down_counter("u").add(-1)


def test_telemetry_config_has_monarchs_fields_and_refuses_bad_values() -> None:
    cfg = TelemetryConfig()
    assert (cfg.retention_secs, cfg.include_dashboard, cfg.dashboard_port) == (3600, False, 8265)
    assert cfg.snapshot_interval_secs == 30.0
    with pytest.raises(TypeError, match="dashboard_port must be int"):
        TelemetryConfig(dashboard_port="80")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="include_dashboard must be bool"):
        TelemetryConfig(include_dashboard=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"0\.\.65535"):
        TelemetryConfig(dashboard_port=70000)
    with pytest.raises(ValueError, match="retention_secs must be >= 0"):
        TelemetryConfig(retention_secs=-1)
    with pytest.raises(TypeError, match="retention_secs must be int"):
        TelemetryConfig(retention_secs=True)


def test_enable_telemetry_returns_the_job_and_checks_its_arguments() -> None:
    job = LocalJob()
    assert job.enable_telemetry() is job
    assert job.enable_telemetry(TelemetryConfig(dashboard_port=0)) is job
    assert job.enable_telemetry(retention_secs=10)._telemetry_config == TelemetryConfig(
        retention_secs=10
    )
    with pytest.raises(TypeError, match="not both"):
        job.enable_telemetry(TelemetryConfig(), retention_secs=1)
    with pytest.raises(TypeError, match="unknown fields"):
        job.enable_telemetry(port=1)
    with pytest.raises(TypeError, match="needs a TelemetryConfig"):
        job.enable_telemetry({"retention_secs": 1})  # type: ignore[arg-type]
    with pytest.warns(NoEffectWarning, match="mesh admin"):
        job.enable_telemetry(mesh_admin_config=object())
    with pytest.warns(NoEffectWarning, match="mesh admin"):  # Monarch's own config class
        job.enable_telemetry(mesh_admin_config=danaus.job.MeshAdminConfig(admin_addr="[::]:0"))
    # Telemetry's configuration is not part of the saved job (as Monarch's).
    assert danaus.job.job_loads(job.dumps()).__dict__.get("_telemetry_config") is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert danaus.job.TelemetryConfig is TelemetryConfig


def test_a_call_header_carries_the_trace_context_as_builtins() -> None:
    ctx = (0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, 1)
    call = protocol.Call("m", 0, "eat", None, 0, ("gpus",), (2,), None, (), 0, ctx)
    kind, back = protocol.decode_header(protocol.wire(call))
    assert kind == protocol.Kind.CALL and back == call and back.trace == ctx
    cast = protocol.Cast("m", "m", "eat", None, False, (), 0, 2, 8, None, (), (), None, (), 0, 0)
    assert cast.trace is None
    assert protocol.decode_header(protocol.wire(cast._replace(trace=ctx)))[1].trace == ctx


# -- danaus.trace records the program's spans too --------------------------------------


class Chef(Actor):
    @endpoint
    def cook(self) -> int:
        with danaus.actor.span("stir"):
            return 1


def test_spans_of_the_client_and_actors_appear_in_a_danaus_trace(
    procs: ProcMesh, tmp_path: Path
) -> None:
    chef = procs.slice(gpus=1).spawn("chef", Chef)
    chef.cook.call_one().get(timeout=REPLY_TIMEOUT)
    path = tmp_path / "t.json"
    with danaus.trace(path), danaus.actor.span("serve"):
        assert chef.cook.call_one().get(timeout=REPLY_TIMEOUT) == 1
    spans = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("cat") == "span"]
    serve = [e for e in spans if e["name"] == "serve"]
    stir = [e for e in spans if e["name"] == "stir"]
    assert len(serve) == 1 and serve[0]["args"] == {}
    assert len(stir) == 1 and stir[0]["pid"] != serve[0]["pid"]
    assert stir[0]["args"]["mesh"] == "chef" and stir[0]["args"]["endpoint"] == "cook"
    assert stir[0]["args"]["rank"] == 0
    # the actor's span lies inside the client's, on the client's clock
    assert serve[0]["ts"] <= stir[0]["ts"] <= serve[0]["ts"] + serve[0]["dur"]


# -- without OpenTelemetry installed ---------------------------------------------------

_WITHOUT = """
import sys
sys.modules["opentelemetry"] = None  # as if danaus[telemetry] were not installed
import asyncio
import danaus, danaus.actor, danaus.job
from danaus._actor.core import telemetry
with danaus.actor.span("x") as s:
    s.set_attribute("k", 1)
@danaus.actor.traced
async def f():
    return 1
assert asyncio.run(f()) == 1
m = danaus.actor.get_meter()
m.create_counter("c").add(1)
m.create_histogram("h").record(1.0)
m.create_gauge("g").set(2)
try:
    telemetry.enable()
except ImportError as e:
    assert "pip install 'danaus[telemetry]'" in str(e), e
else:
    raise AssertionError("enable() without OpenTelemetry did not raise")
import warnings
job = danaus.job.LocalJob().enable_telemetry()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    job.state(cached_path=None)  # best effort: a warning, and the job runs
[w] = caught
assert w.category is RuntimeWarning and w.filename == "<string>", (w.category, w.filename)
print(w.message, file=sys.stderr)
assert not telemetry.ON
print("ok")
"""


def test_without_opentelemetry_the_api_is_a_no_op_and_enabling_says_what_to_install() -> None:
    r = subprocess.run(
        [sys.executable, "-c", _WITHOUT],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(SRC)},
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr
    assert "telemetry could not start; the job runs without it" in r.stderr
    assert "pip install 'danaus[telemetry]'" in r.stderr


def test_a_span_that_fails_to_start_or_end_leaves_the_call_untraced_not_failed(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Tracing must never fail an endpoint: an error starting the span (an exporter that
    cannot be built, say) or ending it is logged and the call runs untraced."""

    def boom(*args: Any) -> Any:
        raise OSError("exporter unreachable")

    monkeypatch.setattr(telemetry, "_start_endpoint_span", boom)
    monkeypatch.setattr(telemetry, "_tracing_errors", 0)
    with caplog.at_level("DEBUG", logger=telemetry.log.name):
        assert telemetry.endpoint_span(object(), object(), (1, 2, 1)) is None
        assert telemetry.endpoint_span(object(), object(), (1, 2, 1)) is None
        telemetry.end_endpoint_span(("not", "a span"), None)  # detach fails: logged, no raise
    warned = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1 and "exporter unreachable" in warned[0].getMessage()
    assert telemetry._tracing_errors == 3


def test_a_proc_where_telemetry_cannot_start_tries_once(monkeypatch: pytest.MonkeyPatch) -> None:
    tries = []

    def cannot() -> None:
        tries.append(1)
        raise ValueError("unknown exporter 'nope'")

    monkeypatch.setattr(telemetry, "ON", False)
    monkeypatch.setattr(telemetry, "_cannot_start", False)
    monkeypatch.setattr(telemetry, "enable", cannot)
    for _ in range(3):
        assert telemetry.endpoint_span(object(), object(), (1, 2, 1)) is None
    assert tries == [1]


def test_the_settings_enable_telemetry_changed_are_put_back_when_the_session_ends() -> None:
    """Telemetry's dashboard and the setting that turns it on in new procs belong to the
    session that started them (a node part): the next session starts without them."""
    code = (
        "import danaus.config as c\n"
        "from danaus._job import telemetry as jt\n"
        "from danaus._runtime.node import this_node\n"
        "from danaus.actor import context, shutdown_context\n"
        "keys = ('telemetry', 'dashboard', 'dashboard_port')\n"
        "before = {k: c.get_global_config()[k] for k in keys}\n"
        "context()\n"
        "cfg = jt.TelemetryConfig(include_dashboard=True, dashboard_port=0)\n"
        "assert jt.start(this_node(), cfg)\n"
        "during = {k: c.get_global_config()[k] for k in keys}\n"
        "assert during['telemetry'] is True and during['dashboard'] is True, during\n"
        "assert jt.active_config() is not None\n"
        "shutdown_context().get()\n"
        "after = {k: c.get_global_config()[k] for k in keys}\n"
        "assert after == before, (before, after)\n"
        "assert jt.active_config() is None\n"
        "print('OK')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(SRC)},
    )
    assert out.returncode == 0 and out.stdout.strip().endswith("OK"), out.stdout + out.stderr
