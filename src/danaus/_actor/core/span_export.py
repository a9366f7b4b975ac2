"""Where ended endpoint spans go: a bounded queue that a batch thread of this process
encodes to OTLP itself and posts through the SDK exporter's HTTP client, or, with
other span processors on the provider, SDK spans handed to them at once (see
``telemetry``'s "endpoint spans"). The process's one instance is
``telemetry._exports``.
"""

from __future__ import annotations

import collections
import logging
import os
import struct
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from .span_record import (
    _CELL,
    _NAME,
    _endpoint_attributes,
    _EndpointSpan,
    _new_span,
)

__all__ = ["Exports", "Flusher", "find_sampler"]

log = logging.getLogger("danaus.telemetry")


def _trace() -> Any:
    """``opentelemetry.trace``, or None when OpenTelemetry's API is not installed."""
    try:
        from opentelemetry import trace
    except ImportError:
        return None
    return trace


def find_sampler(provider: Any) -> Any:
    """``provider``'s sampler unless it samples as the SDK's default parent-based ones
    do for a remote parent (sampled: on; not sampled: off), which the hot path does
    itself from the caller's flags."""
    sampler = getattr(provider, "sampler", None)
    if sampler is None:
        return None
    try:
        from opentelemetry.sdk.trace import sampling
    except ImportError:
        return None
    if (
        isinstance(sampler, sampling.ParentBased)
        and getattr(sampler, "_remote_parent_sampled", None) is sampling.ALWAYS_ON
        and getattr(sampler, "_remote_parent_not_sampled", None) is sampling.ALWAYS_OFF
    ):
        return None
    return sampler


# An OTLP span's ids (trace_id, span_id, parent_span_id: fields 1, 2 and 4, bytes,
# big-endian) and times (start and end: fields 7 and 8, fixed64, little-endian).
_IDS = struct.Struct(">2sQQ2sQ2sQ")
_TIMES = struct.Struct("<cQcQ")
_LOW64 = (1 << 64) - 1


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


class Exports:
    """Where ended endpoint spans go (the process's one instance, ``telemetry._exports``).

    ``add`` (the hot path) appends to a bounded queue (``OTEL_BSP_MAX_QUEUE_SIZE``,
    16384: beyond it the oldest are dropped and counted) when this process exports
    over OTLP/HTTP through danaus's own provider; a batch thread wakes every
    ``OTEL_BSP_SCHEDULE_DELAY`` ms (5000), or once ``OTEL_BSP_MAX_EXPORT_BATCH_SIZE``
    (4096) wait, and posts them, that many a request. With other span processors on the provider (a
    program's own exporter) each span is made an SDK ``ReadableSpan`` and given to
    them at once; with none, nothing is exported (the spans table still has it).
    """

    def __init__(
        self,
        on_sampler: Callable[[Any], None] | None = None,
        ours: dict[str, Any] | None = None,
    ) -> None:
        # told the provider's sampler whenever where spans go is decided anew
        self.on_sampler = on_sampler
        # What danaus installed (``otel_setup.install_providers``): its tracer provider,
        # the span processors it added, and the OTLP/HTTP exporters the batch thread
        # posts through.
        self.ours: dict[str, Any] = (
            ours if ours is not None else {"provider": None, "processors": set(), "fast": []}
        )
        self.trace: Any = None  # opentelemetry.trace, once decided
        self.lock = threading.Lock()  # one export at a time
        # Larger than the SDK's defaults (2048 and 512): a request costs the HTTP client
        # ~1-3 ms of Python whatever it holds, which at 512 spans was most of what
        # exporting a span cost; the variables, when set, are read as the SDK reads them.
        self.queue: collections.deque[_EndpointSpan] = collections.deque(
            maxlen=_env_int("OTEL_BSP_MAX_QUEUE_SIZE", 16384)
        )
        # at most the queue's size, as the SDK's BatchSpanProcessor requires
        self.batch = min(_env_int("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 4096), self.queue.maxlen or 1)
        self.delay = _env_int("OTEL_BSP_SCHEDULE_DELAY", 5000) / 1000
        self.wake = threading.Event()
        self.woken = False  # wake was set and the thread has not run since
        self.thread: threading.Thread | None = None
        self.dropped = 0
        self.exported = 0  # spans posted (or handed to the SDK's processors)
        self.failed = 0  # spans whose export failed
        self.mode = ""  # "" not decided yet, "otlp", "sdk" or "none"
        self.seen: Any = None  # the provider's span processors the mode was decided for
        self.active: Any = None  # the provider's multi-processor (holding them)
        self.fast = False  # mode "otlp" and its batch thread running: add() may be inlined
        self.provider: Any = None
        self.exporters: list[Any] = []  # the OTLP exporters posting in "otlp" mode
        # per actor (its cell) and endpoint: name, kind and attributes, encoded
        self._pieces: weakref.WeakKeyDictionary[Any, dict[str, tuple[bytes, bytes]]] = (
            weakref.WeakKeyDictionary()
        )
        self._head: tuple[bytes, bytes] | None = None  # the resource and scope, encoded

    # -- the hot path --

    def add(self, s: _EndpointSpan) -> None:
        mode = self._mode()
        if mode == "otlp":
            q = self.queue
            if len(q) == q.maxlen:
                self.dropped += 1
            q.append(s)
            if len(q) >= self.batch and not self.woken:
                self.woken = True
                self.wake.set()
            if not self.fast:
                self._start()
        elif mode == "sdk":
            self._to_sdk([s])

    def _mode(self) -> str:
        provider = self.provider
        active = getattr(provider, "_active_span_processor", None)
        procs = getattr(active, "_span_processors", None)
        if (
            procs is not self.seen
            or not provider
            or self.trace.get_tracer_provider() is not provider
        ):
            self._decide()
        return self.mode

    def _decide(self) -> None:
        self.trace = trace = _trace()
        provider = trace.get_tracer_provider() if trace is not None else None
        active = getattr(provider, "_active_span_processor", None)
        procs = getattr(active, "_span_processors", None)
        self.provider, self.seen, self.active = provider, procs, active
        self.fast = False
        self._head = None
        self._pieces = weakref.WeakKeyDictionary()
        if self.on_sampler is not None:
            self.on_sampler(find_sampler(provider))
        if procs is None:
            self.mode = "none"  # not the SDK's provider: nothing to hand spans to
        elif provider is self.ours.get("provider") and set(procs) <= self.ours["processors"]:
            self.exporters = list(self.ours["fast"])
            self.mode = "otlp" if self.exporters else ("sdk" if len(procs) > 1 else "none")
        else:
            self.mode = "sdk" if procs else "none"

    def _start(self) -> None:
        with self.lock:
            if self.thread is None:
                self.thread = threading.Thread(
                    target=self._run, name="danaus-span-export", daemon=True
                )
                self.thread.start()
            # A provider's processors are swapped for a new tuple when one is added.
            self.fast = self.mode == "otlp" and self.seen is not None

    # -- the batch thread --

    def _run(self) -> None:
        while True:
            self.wake.wait(self.delay)
            self.wake.clear()
            self.woken = False
            self.flush()

    def flush(self) -> None:
        """Export every span waiting now (any thread; the batch thread's work). After
        a batch that could not be exported (the exporter retried as its settings say),
        the spans still waiting are dropped and counted, so that a collector that is
        down costs one exporter timeout, not one per batch (at exit too)."""
        with self.lock:
            q = self.queue
            while q:
                batch: list[_EndpointSpan] = []
                try:
                    while len(batch) < self.batch:
                        batch.append(q.popleft())
                except IndexError:
                    pass
                try:
                    ok = self._post(batch)
                except Exception as e:  # an exporter that failed: counted, logged once
                    ok = False
                    if not self.failed:
                        log.warning("exporting endpoint spans failed: %s: %s", type(e).__name__, e)
                if not ok:
                    self.failed += len(batch) + len(q)
                    q.clear()

    def _post(self, batch: list[_EndpointSpan]) -> bool:
        """Export ``batch``; False when an exporter could not."""
        if self.mode != "otlp":
            self._to_sdk(batch)
            return True
        data = self.encode(batch)
        ok = True
        for exp in self.exporters:
            client = getattr(exp, "_client", None)
            # opentelemetry-exporter-otlp-proto-http's client (1.40 on), else its _export
            done = client.export(data).success if client is not None else exp._export(data).ok
            ok = ok and bool(done)
        if ok:
            self.exported += len(batch)
        return ok

    def encode(self, batch: list[_EndpointSpan]) -> bytes:
        """An OTLP ``ExportTraceServiceRequest`` of ``batch``, encoded by hand: each
        span's ids, times and status around its actor's pieces (name, kind,
        attributes), encoded once by OpenTelemetry's own encoder."""
        if self._head is None:
            self._head = self._encode_head()
        resource, scope = self._head
        offset = time.time_ns() - time.perf_counter_ns()
        spans = []
        pieces = self._pieces
        ids, times = _IDS.pack, _TIMES.pack
        for s in batch:
            tid, sid, pid, _, cell, name, t0, t1, error, _ = s
            if type(cell) is dict:  # a transfer's: attributes of its own
                lead, piece = self._encode_piece(s)
            else:
                per = pieces.get(cell)
                if per is None:
                    per = pieces[cell] = {}
                got = per.get(name)
                if got is None:
                    got = per[name] = self._encode_piece(s)
                lead, piece = got
            fixed = ids(
                b"\n\x10", tid >> 64, tid & _LOW64, b"\x12\x08", sid, b'"\x08', pid
            ) + times(b"9", t0 + offset, b"A", t1 + offset)
            if error is None:
                spans.append(lead + fixed + piece)
            else:
                body = fixed + piece + self._encode_error(s, offset)
                spans.append(b"\x12" + _varint(len(body)) + body)
        scope_spans = scope + b"".join(spans)
        rs = resource + b"\x12" + _varint(len(scope_spans)) + scope_spans
        return b"\n" + _varint(len(rs)) + rs

    def _attributes(self, s: _EndpointSpan) -> dict[str, Any]:
        cell, name = s[_CELL], s[_NAME]
        if type(cell) is dict:  # a transfer's span carries its attributes
            return cell
        attrs = dict(_endpoint_attributes(cell, name))
        inst = cell.ctx_instance
        attrs["danaus.actor"] = str(inst.actor_id)
        attrs["rpc.system"] = "danaus"
        attrs["rpc.service"] = inst.class_name
        attrs["rpc.method"] = name
        return attrs

    def _readable(self, s: _EndpointSpan, offset: int) -> Any:
        from opentelemetry.sdk.trace import Event, ReadableSpan
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope
        from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

        trace_id, span_id, parent_id, fl, _, name, t0, t1, e, kind = s
        flags = TraceFlags(fl & 0xFF)
        status, events = Status(StatusCode.UNSET), ()
        if e is not None:
            status = Status(StatusCode.ERROR, f"{type(e).__name__}: {e}")
            events = (  # type: ignore[assignment]
                Event(
                    "exception",
                    {"exception.type": type(e).__name__, "exception.message": str(e),
                     "exception.escaped": "False"},
                    t1 + offset,
                ),
            )  # fmt: skip
        return ReadableSpan(
            name,
            context=SpanContext(trace_id, span_id, is_remote=False, trace_flags=flags),
            parent=SpanContext(trace_id, parent_id, is_remote=kind == 2, trace_flags=flags),
            resource=getattr(self.provider, "resource", None),
            attributes=self._attributes(s),
            events=events,
            kind=SpanKind.SERVER if kind == 2 else SpanKind.INTERNAL,
            status=status,
            start_time=t0 + offset,
            end_time=t1 + offset,
            instrumentation_scope=InstrumentationScope("danaus"),
        )

    def _to_sdk(self, batch: list[_EndpointSpan]) -> None:
        active = getattr(self.provider, "_active_span_processor", None)
        if active is None:
            return
        offset = time.time_ns() - time.perf_counter_ns()
        for s in batch:
            active.on_end(self._readable(s, offset))
            self.exported += 1

    def _encode_one(self, s: _EndpointSpan) -> Any:
        from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

        return encode_spans([self._readable(s, 0)]).resource_spans[0]

    def _encode_head(self) -> tuple[bytes, bytes]:
        probe = _new_span(1, 1, 1, 1, {}, "probe")
        rs = self._encode_one(probe)
        res = rs.resource.SerializeToString()
        scope = rs.scope_spans[0].scope.SerializeToString()
        return b"\n" + _varint(len(res)) + res, b"\n" + _varint(len(scope)) + scope

    def _encode_piece(self, s: _EndpointSpan) -> tuple[bytes, bytes]:
        from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan

        full = self._encode_one(s).scope_spans[0].spans[0]
        pb = PbSpan(name=full.name, kind=full.kind, flags=full.flags)
        pb.attributes.extend(full.attributes)
        pb.status.SetInParent()  # UNSET, as the SDK's encoder writes it (an error adds its own)
        piece = pb.SerializeToString()
        # the span's field tag and length, for a span without an error (fixed-size ids)
        return b"\x12" + _varint(_IDS.size + _TIMES.size + len(piece)), piece

    def _encode_error(self, s: _EndpointSpan, offset: int) -> bytes:
        from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan

        full = self._encode_one_at(s, offset)
        piece = PbSpan(status=full.status)
        piece.events.extend(full.events)
        data: bytes = piece.SerializeToString()
        return data

    def _encode_one_at(self, s: _EndpointSpan, offset: int) -> Any:
        from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

        return encode_spans([self._readable(s, offset)]).resource_spans[0].scope_spans[0].spans[0]


def _env_int(name: str, default: int) -> int:
    try:
        value = int(os.environ.get(name, "") or default)
    except ValueError:
        log.warning("%s=%r is not an integer; using %d", name, os.environ.get(name), default)
        return default
    return value if value > 0 else default


class Flusher:
    """A span processor of danaus's provider that does nothing per span; the
    provider's ``force_flush`` and ``shutdown`` (at exit) export the endpoint spans
    waiting in ``exports``."""

    def __init__(self, exports: Exports) -> None:
        self.exports = exports

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        pass

    def on_end(self, span: Any) -> None:
        pass

    def _on_ending(self, span: Any) -> None:
        pass

    def shutdown(self) -> None:
        self.exports.flush()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        self.exports.flush()
        return True
