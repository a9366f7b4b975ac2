"""An actor's measurements: its endpoint metrics, and what it keeps of the calls that
were sampled for the messages table or traced.

A `Meter` is a part of `ActorCell`. It is
written on the actor's thread only (its endpoint metrics are
``EndpointStats``, ``_runtime/messaging/metrics.py``) and read by ``STATS``
snapshots on the I/O thread, which may see a count one call behind, never a
broken one.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from ..._runtime.messaging.metrics import EndpointStats, MessageRow, Observing, Recent, Tracer
from ..._wire.ids import PortId
from . import telemetry

__all__ = ["Meter", "MeterHost"]


class MeterHost(Protocol):
    """What a meter reads of its runtime: whether metrics are on and the rings of the
    telemetry query (with metrics), both in ``observing``, and the trace running now,
    if any."""

    @property
    def observing(self) -> Observing: ...

    tracer: Tracer | None


class Meter:
    """Calls, errors and latencies per endpoint of one actor, and the endpoint running now.

    ``subject`` is what telemetry names the actor by (its cell, handed on as is).
    """

    def __init__(self, rt: MeterHost, mesh_id: str, rank: int, subject: object) -> None:
        self._rt = rt
        self._metrics = rt.observing.metrics
        self._recent = rt.observing.recent
        self._subject = subject
        self.label = f"{mesh_id}[{rank}]"
        self.rank = rank
        self.display_name = mesh_id.rsplit(".", 1)[0]
        self.cls_name = ""  # the actor's class, once constructed
        self.stats: dict[str, EndpointStats] = {}
        self.running: str | None = None  # the endpoint running now

    def named(self, display_name: str, cls_name: str) -> None:
        """The actor's name and class, known once its spawn is decoded."""
        self.display_name = display_name
        self.cls_name = cls_name

    def measured(
        self,
        name: str,
        t0: int,
        ok: bool,
        port: PortId | None,
        index: int,
        row: MessageRow | None,
        active: Any,
    ) -> None:
        """Count one execution of endpoint ``name`` that started at ``t0`` (metrics), and
        trace it (when tracing); ``row``: the call's row for the messages table, when it
        was sampled; ``active``: its OpenTelemetry span, when the call carried a trace
        context. A sampled or traced call is kept as a span of the spans table too
        (issue 41: it was empty)."""
        self.running = None
        if self._metrics:
            t1 = time.perf_counter_ns()
            st = self.stats.get(name)
            if st is None:
                st = self.stats[name] = EndpointStats()
            seconds = (t1 - t0) * 1e-9
            st.record(seconds, ok)
            if row is not None or active is not None:
                recent = self._recent
                if row is not None:
                    row.started_ns, row.ended_ns, row.ok = t0, t1, ok
                    if recent is not None:
                        recent.messages.append(row)
                if recent is not None:
                    self._keep_span(recent, name, t0, t1, ok, active)
                if telemetry.ON:  # the same over OTLP, as OpenTelemetry instruments
                    telemetry.endpoint_measured(self._subject, name, seconds)
        tracer = self._rt.tracer
        if tracer is not None:
            flow = f"c:{port.proc.name}:{port.port}:{index}" if port is not None else None
            args = {"actor": self.label, "ok": ok}
            tracer.span(f"{self.display_name}.{name}", "execute", t0, args, flow_in=flow)

    def _keep_span(
        self, recent: Recent, name: str, t0: int, t1: int, ok: bool, active: Any
    ) -> None:
        """Keep the span of one handled call in the spans table, with its OpenTelemetry
        ids when the call was traced."""
        trace_id = span_id = parent_id = None
        if active is not None and active[0] is not None:
            trace_id, span_id, parent_id = telemetry.ids_of(active[0])
        cls = self.cls_name
        recent.span(
            f"{cls}.{name}",
            t0,
            t1,
            f"{self.display_name}[{self.rank}]",
            trace_id,
            span_id,
            parent_id,
            {"endpoint": name, "class": cls, "ok": ok, "kind": "endpoint"},
        )
