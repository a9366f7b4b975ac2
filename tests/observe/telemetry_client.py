"""A client that test_telemetry.py runs in a process of its own: OpenTelemetry's
providers are process-global (set once), so each scenario gets a fresh process.

``python telemetry_client.py memory``: the client records its spans in memory, each
proc records its own in memory too (a ``Recorder`` actor per proc, spawned before
any traced call, adds an in-memory exporter to the proc's provider), and the
client prints every span, its own and the procs', as one JSON document.

``python telemetry_client.py otlp``: nothing is set up by the program; danaus
exports over OTLP/HTTP as the ``OTEL_*`` variables of the environment say, and the
test's receiver gathers the spans and metrics.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from danaus import config
from danaus.actor import Actor, ActorMesh, endpoint, get_meter, span, traced
from danaus.job import LocalJob, TelemetryConfig

TIMEOUT = 60.0


class Recorder(Actor):
    """Keeps its proc's finished spans in memory and hands them out."""

    def __init__(self) -> None:
        from opentelemetry import trace
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
            InMemorySpanExporter,
        )

        self.mem = InMemorySpanExporter()
        trace.get_tracer_provider().add_span_processor(SimpleSpanProcessor(self.mem))  # type: ignore[attr-defined]

    @endpoint
    def spans(self) -> list[dict[str, Any]]:
        return [plain(s) for s in self.mem.get_finished_spans()]


class Philosopher(Actor):
    @endpoint
    def eat(self, x: int) -> int:
        get_meter().create_counter("meals").add(1, {"dish": "rice"})
        with span("chew"):
            return x + 1

    @endpoint
    def fail(self) -> None:
        raise ValueError("burnt")

    @endpoint
    def untraced(self) -> int:
        return 0

    @endpoint(instrument=False)
    def quiet(self) -> None:
        with span("hush"):
            pass


class Thinker(Actor):
    """An async actor that calls another actor from inside its span."""

    @endpoint
    async def think(self, other: ActorMesh[Philosopher]) -> int:
        with span("ponder"):
            await asyncio.sleep(0)
            return await other.eat.call_one(1)


def plain(s: Any) -> dict[str, Any]:
    parent = s.parent
    return {
        "name": s.name,
        "trace": f"{s.context.trace_id:032x}",
        "id": f"{s.context.span_id:016x}",
        "parent": f"{parent.span_id:016x}" if parent is not None else None,
        "kind": s.kind.name,
        "status": s.status.status_code.name,
        "attributes": dict(s.attributes or {}),
        "events": [e.name for e in s.events],
    }


@traced
def client_step(
    pair: ActorMesh[Philosopher], thinker: ActorMesh[Thinker], wide: ActorMesh[Philosopher]
) -> None:
    pair.eat.call(0).get(timeout=TIMEOUT)  # direct, to each actor
    thinker.think.call_one(pair.slice(gpus=1)).get(timeout=TIMEOUT)  # nested
    pair.slice(gpus=0).quiet.call_one().get(timeout=TIMEOUT)
    wide.eat.call(0).get(timeout=TIMEOUT)  # down the cast tree
    wide.slice(gpus=3).eat.call_one(0).get(timeout=TIMEOUT)
    try:
        pair.slice(gpus=1).fail.call_one().get(timeout=TIMEOUT)
    except Exception:
        pass


def main(scenario: str) -> None:
    mem = None
    if scenario == "memory":
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
            InMemorySpanExporter,
        )

        mem = InMemorySpanExporter()
        tp = TracerProvider()
        tp.add_span_processor(SimpleSpanProcessor(mem))
        trace.set_tracer_provider(tp)  # the program's own: danaus leaves it in place
    config.configure(tree_min_ranks=3)
    job = LocalJob().enable_telemetry(TelemetryConfig(dashboard_port=0))
    procs = job.state(cached_path=None).hosts.spawn_procs(per_host={"gpus": 4})
    recorders = procs.spawn("recorders", Recorder) if scenario == "memory" else None
    if recorders is not None:
        recorders.initialized.get(timeout=TIMEOUT)
    pair = procs.slice(gpus=slice(0, 2)).spawn("pair", Philosopher)
    thinker = procs.slice(gpus=0).spawn("thinker", Thinker)
    wide = procs.spawn("wide", Philosopher)
    pair.untraced.call().get(timeout=TIMEOUT)  # outside any span: no context, no span
    client_step(pair, thinker, wide)
    if recorders is not None and mem is not None:
        spans = [plain(s) for s in mem.get_finished_spans()]
        for got in recorders.spans.call().get(timeout=TIMEOUT).values():
            spans.extend(got)
        print(json.dumps({"spans": spans}), flush=True)
    procs.stop().get(timeout=TIMEOUT)  # each proc flushes its exporters as it exits
    job.kill()


if __name__ == "__main__":
    main(sys.argv[1])
