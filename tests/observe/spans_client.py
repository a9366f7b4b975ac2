"""A client that test_spans.py runs in a process of its own (OpenTelemetry's providers
are process-global): every call is made inside a span, and the endpoints open user
spans and move bytes over the data plane, so that endpoint, user and transfer spans
are recorded. Exports over OTLP as the ``OTEL_*`` variables of the environment say.

``python spans_client.py every``: one root span around ``CALLS`` calls; prints the
root's trace id and the spans table's rows of that trace (JSON, last line).

``python spans_client.py roots``: ``ROOTS`` root spans of one call each, sampled as
``OTEL_TRACES_SAMPLER`` says; prints each root's trace id and whether it was sampled.
"""

from __future__ import annotations

import json
import sys

from danaus import telemetry
from danaus.actor import Actor, endpoint, span, this_host
from danaus.rdma import RDMABuffer

TIMEOUT = 60.0
CALLS = 20
ROOTS = 40


class Worker(Actor):
    @endpoint
    def work(self, buf: RDMABuffer | None) -> int:
        with span("think"):
            if buf is not None:
                dst = bytearray(buf.size())
                buf.read_into(dst).get(timeout=TIMEOUT)
                return sum(dst)
            return 0

    @endpoint
    def flush(self) -> None:
        from opentelemetry import trace

        trace.get_tracer_provider().force_flush()  # type: ignore[attr-defined]


def main(scenario: str) -> None:
    from opentelemetry import trace

    from danaus._actor.core import telemetry as core

    core.enable()
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    workers = procs.spawn("workers", Worker)
    data = bytearray(b"\x01" * 4096)
    buf = RDMABuffer(data)
    out: dict[str, object] = {}
    if scenario == "every":
        with span("root"):
            root = trace.get_current_span().get_span_context()
            for i in range(CALLS):
                got = workers.slice(gpus=i % 2).work.call_one(buf if i < 4 else None)
                assert got.get(timeout=TIMEOUT) == (4096 if i < 4 else 0)
        trace_id = format(root.trace_id, "032x")
        out["trace"] = trace_id
        out["rows"] = telemetry.query(
            "SELECT name, actor, trace_id, span_id, parent_id, attributes FROM spans "
            f"WHERE trace_id = '{trace_id}' ORDER BY started"
        )
    else:
        roots = []
        for _ in range(ROOTS):
            with span("root"):
                sc = trace.get_current_span().get_span_context()
                roots.append((format(sc.trace_id, "032x"), sc.trace_flags.sampled))
                workers.slice(gpus=0).work.call_one(None).get(timeout=TIMEOUT)
        out["roots"] = roots
    workers.flush.call().get(timeout=TIMEOUT)
    print(json.dumps(out), flush=True)
    procs.stop().get(timeout=TIMEOUT)
    trace.get_tracer_provider().shutdown()  # type: ignore[attr-defined]


if __name__ == "__main__":
    main(sys.argv[1])
