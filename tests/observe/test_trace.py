"""``danaus.trace``: spans from every proc, aligned on one clock, as Chrome/Perfetto JSON."""

from __future__ import annotations

import concurrent.futures
import json
import logging
from pathlib import Path
from typing import Any

import pytest

import danaus
from danaus._actor.api import stats
from danaus.actor import Actor, ActorMesh, ProcMesh, endpoint, this_host

from .conftest import REPLY_TIMEOUT, Worker, proc_names


class Relay(Actor):
    """Calls another actor from inside its endpoint: a call that crosses three procs."""

    def __init__(self, target: ActorMesh[Worker]) -> None:
        self.target = target

    @endpoint
    def relay(self, x: int) -> Any:
        return self.target.ping.call_one(x).get(timeout=REPLY_TIMEOUT)


def _load(path: Path) -> dict[str, Any]:
    doc = json.loads(path.read_text())
    assert isinstance(doc["traceEvents"], list)
    return doc


def _procs(doc: dict[str, Any]) -> dict[int, str]:
    return {
        e["pid"]: e["args"]["name"]
        for e in doc["traceEvents"]
        if e["ph"] == "M" and e["name"] == "process_name"
    }


def test_a_trace_has_spans_from_every_proc_on_one_clock(procs: ProcMesh, tmp_path: Path) -> None:
    inner = procs.slice(gpus=1).spawn("inner", Worker)
    outer = procs.slice(gpus=0).spawn("outer", Relay, inner)
    outer.relay.call_one(0).get(timeout=REPLY_TIMEOUT)  # warm: nothing of this is traced
    path = tmp_path / "trace.json"
    with danaus.trace(path) as t:
        assert outer.relay.call_one(7).get(timeout=REPLY_TIMEOUT) == 7
    assert t.summary["procs_missing"] == [] and t.summary["dropped"] == 0
    doc = _load(path)
    names = _procs(doc)
    assert sum(n.startswith("client") for n in names.values()) == 1
    assert sum(n.startswith("proc") for n in names.values()) >= 2
    events = doc["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    assert {"send", "deliver", "execute", "reply"} <= {e["cat"] for e in spans}
    [outer_exec] = [e for e in spans if e["name"] == "outer.relay"]
    [inner_exec] = [e for e in spans if e["name"] == "inner.ping"]
    assert outer_exec["pid"] != inner_exec["pid"]
    # One clock: the inner call runs inside the outer one, in another process.
    assert outer_exec["ts"] <= inner_exec["ts"]
    assert inner_exec["ts"] + inner_exec["dur"] <= outer_exec["ts"] + outer_exec["dur"]
    # The client's call spans the outer execution.
    [begin] = [e for e in events if e["ph"] == "b" and e["name"] == "outer.relay()"]
    [end] = [e for e in events if e["ph"] == "e" and e["id"] == begin["id"]]
    assert begin["ts"] <= outer_exec["ts"] and outer_exec["ts"] + outer_exec["dur"] <= end["ts"]
    # Arrows: each send to the execution it caused, each reply to where it arrived.
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    finishes = {e["id"]: e for e in events if e["ph"] == "f"}
    assert starts and set(starts) == set(finishes)
    calls = [(starts[i], finishes[i]) for i in starts if starts[i]["cat"] == "call"]
    assert {f["pid"] for _, f in calls} == {outer_exec["pid"], inner_exec["pid"]}
    assert all(s["ts"] <= f["ts"] for s, f in calls)


def test_procs_spawned_during_a_trace_are_traced(tmp_path: Path) -> None:
    path = tmp_path / "late.json"
    with danaus.trace(path):
        pm = this_host().spawn_procs(per_host={"gpus": 1})
        mesh = pm.spawn("late", Worker)
        mesh.ping.call_one(1).get(timeout=REPLY_TIMEOUT)
    doc = _load(path)
    spans = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["name"] == "late.ping"]
    assert len(spans) == 1
    assert _procs(doc)[spans[0]["pid"]].startswith("proc")
    pm.stop().get(timeout=REPLY_TIMEOUT)


def test_a_proc_whose_clock_offset_was_lost_is_traced_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A proc spawned during the trace starts tracing, but the answer carrying its clock
    is lost: its spans are kept, and a warning names it (they may be misaligned)."""
    real = stats.ask_trace_start

    def answer_lost(rt: Any, procs: Any, arrived: Any = None) -> Any:
        real(rt, procs, arrived)  # the procs are asked, and start tracing
        lost: concurrent.futures.Future[Any] = concurrent.futures.Future()
        lost.set_exception(ConnectionError("the answer was lost on the way"))
        return lost

    logger = logging.getLogger("danaus.trace")
    logger.addHandler(caplog.handler)  # the danaus logger may not propagate to the root
    path = tmp_path / "lost.json"
    try:
        with danaus.trace(path) as t:
            monkeypatch.setattr(stats, "ask_trace_start", answer_lost)
            pm = this_host().spawn_procs(per_host={"gpus": 1})
            monkeypatch.undo()
            mesh = pm.spawn("lost_clock", Worker)
            mesh.ping.call_one(1).get(timeout=REPLY_TIMEOUT)
    finally:
        logger.removeHandler(caplog.handler)
    assert t.summary["procs_missing"] == []
    spans = [e for e in _load(path)["traceEvents"] if e["ph"] == "X"]
    assert [e for e in spans if e["name"] == "lost_clock.ping"]  # its spans are kept
    [proc] = proc_names(pm)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(
        f"clock offset of proc {proc} was lost" in m and "the answer was lost" in m
        for m in warnings
    ), warnings
    pm.stop().get(timeout=REPLY_TIMEOUT)


def test_traces_do_not_nest_and_tracing_stops_with_the_block(
    procs: ProcMesh, tmp_path: Path
) -> None:
    mesh = procs.spawn("traced_once", Worker)
    with (
        danaus.trace(tmp_path / "a.json"),
        pytest.raises(RuntimeError, match="do not nest"),
        danaus.trace(tmp_path / "b.json"),
    ):
        pass
    mesh.ping.call().get(timeout=REPLY_TIMEOUT)  # after the block: recorded nowhere
    with danaus.trace(tmp_path / "c.json"):
        pass
    doc = _load(tmp_path / "c.json")
    assert not [e for e in doc["traceEvents"] if e["ph"] == "X" and "traced_once" in e["name"]]


def test_a_trace_can_also_go_to_opentelemetry(procs: ProcMesh, tmp_path: Path) -> None:
    from opentelemetry import trace as ot
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    ot.set_tracer_provider(provider)
    mesh = procs.spawn("otel", Worker)
    mesh.initialized.get(timeout=REPLY_TIMEOUT)
    with danaus.trace(tmp_path / "o.json", otel=True):
        mesh.ping.call(3).get(timeout=REPLY_TIMEOUT)
    spans = exporter.get_finished_spans()
    executed = [s for s in spans if s.name == "otel.ping"]
    assert len(executed) == 2
    assert all(s.start_time is not None and s.end_time >= s.start_time for s in executed)
    assert {s.attributes["danaus.proc"] for s in executed} == set(proc_names(procs))
