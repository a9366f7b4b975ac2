"""Issue 41 part 2: a span for every call, cheap. Endpoint spans are recorded on the hot
path as plain values and exported over OTLP by a batch thread that encodes them itself;
these tests check that what arrives is what the SQL ``spans`` table holds (the same
trace, span and parent ids) for endpoint, user and transfer spans, that the hand-made
encoding is what OpenTelemetry's protobuf definitions decode, and that sampling is
OpenTelemetry's parent-based ratio sampling. The clients run in processes of their own
(``spans_client.py``): OpenTelemetry's providers are process-global.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from danaus._actor.core import span_export, telemetry
from danaus.testing import wait_until

from .test_telemetry import _Receiver

CLIENT = Path(__file__).with_name("spans_client.py")
SRC = Path(telemetry.__file__).resolve().parents[3]


@pytest.fixture
def receiver() -> Iterator[_Receiver]:
    r = _Receiver()
    try:
        yield r
    finally:
        r.close()


def _run(scenario: str, receiver: _Receiver, **env: str) -> dict[str, Any]:
    r = subprocess.run(
        [sys.executable, str(CLIENT), scenario],
        capture_output=True,
        text=True,
        timeout=150,
        env={
            **os.environ,
            "PYTHONPATH": str(SRC),
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
            "OTEL_SERVICE_NAME": "spans",
            "OTEL_BSP_SCHEDULE_DELAY": "50",
            **env,
        },
        cwd=CLIENT.parent,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-6000:]
    return json.loads(r.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.timeout(180)
def test_every_call_in_a_span_is_in_the_spans_table_and_exported_with_the_same_ids(
    receiver: _Receiver,
) -> None:
    got = _run(
        "every",
        receiver,
        OTEL_TRACES_SAMPLER="parentbased_traceidratio",
        OTEL_TRACES_SAMPLER_ARG="1.0",
    )
    trace_id, rows = got["trace"], got["rows"]
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_kind.setdefault(json.loads(r["attributes"]).get("kind"), []).append(r)
    endpoints, users, transfers = by_kind["endpoint"], by_kind["user"], by_kind["transfer"]
    assert len(endpoints) == 20 and all(r["name"] == "Worker.work" for r in endpoints)
    assert {r["actor"] for r in endpoints} == {"workers[0]", "workers[1]"}
    assert len([r for r in users if r["name"] == "think"]) == 20
    assert len(transfers) == 4 and all(r["name"] == "rdma.transfer" for r in transfers)
    [root] = [r for r in users if r["name"] == "root"]
    ids = {r["span_id"]: r for r in rows}
    for r in endpoints:  # each endpoint's span is the client's root span's child
        assert r["parent_id"] == root["span_id"]
    for r in users:  # and each user span the child of the endpoint span it ran in
        if r["name"] == "think":
            assert ids[r["parent_id"]]["name"] == "Worker.work"
    for r in transfers:  # a transfer, of the user span that made it
        assert ids[r["parent_id"]]["name"] == "think"
        assert json.loads(r["attributes"])["transfer.bytes"] == 4096

    # Over OTLP, from the procs' batch threads: the same spans, with the same ids.
    wait_until(lambda: len([s for s in receiver.spans if s["trace"] == trace_id]) >= len(ids), 60)
    with receiver.lock:
        exported = {s["id"]: s for s in receiver.spans if s["trace"] == trace_id}
    assert set(exported) == set(ids)  # 20 endpoint, 20 think, 4 transfer spans and the root
    for span_id, row in ids.items():
        s = exported[span_id]
        assert s["parent"] == row["parent_id"]
        assert s["name"] == ("work" if row["name"] == "Worker.work" else row["name"])
    for r in endpoints:
        s = exported[r["span_id"]]
        a = s["attributes"]
        assert s["kind"] == "SERVER" and s["status"] == "UNSET"
        assert a["rpc.method"] == a["danaus.endpoint"] == "work"
        assert a["rpc.service"] == a["danaus.actor.class"] == "Worker"
        assert a["danaus.mesh"] == "workers" and a["danaus.actor"].endswith(f"[{a['danaus.rank']}]")
    for r in transfers:
        s = exported[r["span_id"]]
        assert s["kind"] == "INTERNAL" and s["attributes"]["danaus.transfer.bytes"] == 4096
    assert receiver.services == {"spans"}


@pytest.mark.timeout(180)
def test_sampling_is_parent_based_on_the_roots_ratio(receiver: _Receiver) -> None:
    """With ``parentbased_traceidratio`` at 0.5, about half the client's root spans are
    sampled, and an endpoint span is exported exactly for the calls made inside a
    sampled root: the procs follow the caller's decision, as OpenTelemetry's
    parent-based samplers do."""
    got = _run(
        "roots",
        receiver,
        OTEL_TRACES_SAMPLER="parentbased_traceidratio",
        OTEL_TRACES_SAMPLER_ARG="0.5",
    )
    roots = got["roots"]
    sampled = {t for t, yes in roots if yes}
    assert 0 < len(sampled) < len(roots)  # 40 roots at 0.5: neither none nor all
    wait_until(lambda: {s["trace"] for s in receiver.spans if s["name"] == "work"} == sampled, 60)
    with receiver.lock:
        works = [s for s in receiver.spans if s["name"] == "work"]
        thinks = {s["trace"] for s in receiver.spans if s["name"] == "think"}
    assert len(works) == len(sampled) and thinks == sampled


@pytest.mark.timeout(180)
def test_a_ratio_of_zero_exports_no_span_of_any_process(receiver: _Receiver) -> None:
    got = _run(
        "roots",
        receiver,
        OTEL_TRACES_SAMPLER="parentbased_traceidratio",
        OTEL_TRACES_SAMPLER_ARG="0",
    )
    assert not any(yes for _, yes in got["roots"])
    assert receiver.spans == []  # the procs flushed and exited: nothing was sent


def test_the_hand_made_encoding_is_otlp() -> None:
    """The batch thread's encoding decodes, with OpenTelemetry's protobuf definitions,
    to what the SDK's own encoder makes of the same spans."""
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    ex = telemetry._Exports()
    attrs = {"danaus.mesh": "m", "danaus.rank": 3, "kind": "x"}
    ok = telemetry._new_span(0xABC << 64 | 7, 0x1234, 0x99, 1, attrs, "rdma.transfer", 1)
    ok[telemetry._T1] = ok[telemetry._T0] + 5000
    failed = telemetry._new_span(5, 6, 7, 1, attrs, "rdma.transfer", 1)
    failed[telemetry._T1] = failed[telemetry._T0] + 10
    failed[telemetry._ERROR] = ValueError("burnt")
    mine = ExportTraceServiceRequest.FromString(ex.encode([ok, failed]))
    offset = mine.resource_spans[0].scope_spans[0].spans[0].start_time_unix_nano - ok[6]
    sdk = encode_spans([ex._readable(ok, offset), ex._readable(failed, offset)])
    assert mine.resource_spans[0].resource == sdk.resource_spans[0].resource
    assert mine.resource_spans[0].scope_spans[0].scope == sdk.resource_spans[0].scope_spans[0].scope
    for a, b in zip(
        mine.resource_spans[0].scope_spans[0].spans,
        sdk.resource_spans[0].scope_spans[0].spans,
        strict=True,
    ):
        assert a == b


class _Prop:
    instrument = True
    name = "step"


def test_a_sampler_that_is_not_parent_based_decides_each_endpoint_span(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The hot path follows the caller's flags only for the SDK's parent-based samplers;
    any other sampler of the provider is asked, as the SDK would ask it."""
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace import sampling

    assert span_export.find_sampler(None) is None

    class Provider:
        sampler: Any = sampling.ParentBased(sampling.TraceIdRatioBased(0.5))

    assert span_export.find_sampler(Provider()) is None  # the default kind: flags decide
    Provider.sampler = sampling.ALWAYS_ON
    assert span_export.find_sampler(Provider()) is sampling.ALWAYS_ON
    Provider.sampler = sampling.ParentBased(
        sampling.ALWAYS_ON, remote_parent_not_sampled=sampling.ALWAYS_ON
    )
    assert span_export.find_sampler(Provider()) is Provider.sampler

    monkeypatch.setattr(telemetry, "ON", True)  # as enable() leaves it, without providers
    telemetry._otel()
    unsampled = (12345, 678, 0)  # the caller's flags: not sampled
    sampled = (12345, 678, 1)
    for sampler, ctx, recorded in (
        (None, unsampled, False),
        (None, sampled, True),
        (sampling.ALWAYS_ON, unsampled, True),  # not parent-based: it decides
        (sampling.ALWAYS_OFF, sampled, False),
    ):
        monkeypatch.setattr(telemetry, "_sampler", sampler)
        active = telemetry.endpoint_span(object(), _Prop(), ctx)
        s, _token = active
        trace_id, span_id, flags = telemetry.outgoing() or (0, 0, 0)
        assert trace_id == 12345 and span_id != 678  # the trace goes on below this span
        assert flags & 1 == recorded
        assert (s is not None) == recorded
        if s is not None:
            assert telemetry.ids_of(s) == (12345, span_id, 678)
        telemetry._current_span.reset(_token)
    assert telemetry.outgoing() is None


def test_a_collector_that_is_down_costs_one_failed_batch_not_one_per_batch() -> None:
    """The exporter retries a batch as its settings say; after one that failed, the
    spans still waiting are dropped and counted rather than each batch waiting out
    the same timeout (at exit, a dead collector would hold the process that long)."""
    pytest.importorskip("opentelemetry.sdk")
    posted: list[bytes] = []

    class Client:
        def __init__(self, ok: bool) -> None:
            self.ok = ok

        def export(self, data: bytes) -> Any:
            posted.append(data)
            return type("Result", (), {"success": self.ok})()

    class Exporter:
        def __init__(self, ok: bool) -> None:
            self._client = Client(ok)

    for ok, posts, exported, failed in ((True, 3, 5, 0), (False, 1, 0, 5)):
        posted.clear()
        ex = telemetry._Exports()
        ex.mode, ex.batch, ex.exporters = "otlp", 2, [Exporter(ok)]
        for i in range(5):
            s = telemetry._new_span(7, i + 1, 9, 1, {"danaus.rank": i}, "rdma.transfer", 1)
            s[telemetry._T1] = s[telemetry._T0] + 1
            ex.queue.append(s)
        ex.flush()
        assert (len(posted), ex.exported, ex.failed, len(ex.queue)) == (posts, exported, failed, 0)
