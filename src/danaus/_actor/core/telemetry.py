"""OpenTelemetry in actors: Monarch's ``span``, ``traced`` and ``get_meter``, and the
trace context that travels with a call.

``span(name)`` is a context manager that records an OpenTelemetry span through the
global tracer provider (tracer ``"danaus"``); inside an actor it carries the actor,
its rank, mesh, class, proc and endpoint as attributes. ``traced`` wraps a function
(sync or async) in one. ``get_meter()`` is the ``"danaus"`` meter of the global meter
provider. All three work without OpenTelemetry installed, as no-ops (Monarch's work
whatever is configured); the API and SDK come with ``pip install 'danaus[telemetry]'``.

Telemetry is *on* in a process after :func:`enable` (the setting ``telemetry``,
``JobTrait.enable_telemetry()``, or a traced call arriving): then each call made
inside a span carries that span's context in its CALL (or CAST) header, inside the
authenticated frame, and the endpoint it reaches runs in a span of its own whose
parent is the caller's (named for the method, as Monarch's; kind SERVER; none for
``@endpoint(instrument=False)``). Calls made outside any
span carry ``None`` and their endpoints record nothing: a span costs ~20 µs of
Python, too much to spend on every message. When telemetry is off the send path
reads one module attribute (:data:`ON`) and the header holds ``None``.

:func:`enable` installs the SDK's tracer and meter providers (unless the program
installed its own) with the exporters the standard variables name:
``OTEL_TRACES_EXPORTER`` / ``OTEL_METRICS_EXPORTER`` (``otlp``, ``console``,
``none``; ``otlp`` by default when an ``OTEL_EXPORTER_OTLP_*ENDPOINT`` is set),
``OTEL_EXPORTER_OTLP_PROTOCOL`` (``http/protobuf``, the default, or ``grpc``), and
every other ``OTEL_*`` variable the SDK and its exporters read (endpoint, headers,
timeout, batch sizes, export interval, ``OTEL_SERVICE_NAME``,
``OTEL_RESOURCE_ATTRIBUTES``). Procs spawned while telemetry is on get the
spawner's ``OTEL_*`` variables (but the headers and other credentials, which no
spawn frame carries: ``env_for_procs``) and turn it on at boot, so each proc
exports its own spans and metrics.

This module imports no OpenTelemetry at import time: the actor core loads without it.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar, overload

from ... import _config as config
from ..._runtime.hosting import host
from ..._runtime.messaging.metrics import BOUNDS
from ..._runtime.node import Node
from .context import _current, _thread_ctx

__all__ = [
    "EXTRA",
    "ON",
    "Span",
    "enable",
    "end_endpoint_span",
    "endpoint_measured",
    "endpoint_span",
    "env_for_procs",
    "get_meter",
    "ids_of",
    "install",
    "outgoing",
    "span",
    "sync_with_config",
    "traced",
]

log = logging.getLogger("danaus.telemetry")

#: How to install what telemetry needs, for error messages.
EXTRA = "pip install 'danaus[telemetry]'"

# The process's, not a session's: OpenTelemetry's providers are process-global (set
# once), and so is whether this process carries span contexts.
#: Whether telemetry is on in this process (see the module's docstring). Read on every
#: send: a plain module attribute, set once by ``enable``.
ON = False

_lock = threading.Lock()  # guards enabling
_trace: Any = None  # cache: opentelemetry.trace once imported; False when not installed
_context: Any = None  # cache: opentelemetry.context, imported with _trace
_tracer: Any = None  # cache: the "danaus" tracer of the global provider (a proxy until set)
_installed = False  # the process's: the providers were set up (or found set up)
# The process's: a traced call found telemetry could not start here (no OpenTelemetry,
# a bad exporter setting); later traced calls run untraced without trying again.
_cannot_start = False
_tracing_errors = 0  # the process's: spans that failed to start or end (the first is logged)


def _otel() -> Any:
    """``opentelemetry.trace``, or None when OpenTelemetry's API is not installed."""
    global _trace, _context
    if _trace is None:
        try:
            from opentelemetry import context, trace
        except ImportError:
            _trace = False
        else:
            _context = context
            _trace = trace
    return _trace or None


def _get_tracer() -> Any:
    global _tracer
    if _tracer is None:
        trace = _otel()
        _tracer = trace.get_tracer("danaus") if trace is not None else False
    return _tracer or None


def missing(what: str) -> ImportError:
    """The error for using ``what`` without the telemetry extra."""
    return ImportError(
        f"{what} needs OpenTelemetry's API and SDK, which danaus does not install by "
        f"default: {EXTRA}"
    )


# -- the actor's attributes -----------------------------------------------------------

# cache: each actor instance's attributes, made once
_attrs_of: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


def actor_attributes() -> dict[str, Any]:
    """The attributes of the actor running this code (empty outside actors): the
    actor's id, class, mesh, rank and proc, and the endpoint it is running."""
    ctx = _current.get()
    if ctx is None:
        ctx = getattr(_thread_ctx, "ctx", None)
    if ctx is None:
        return {}
    inst = ctx.actor_instance
    cell = inst._cell
    if cell is None:  # the client's (or a proc's) root instance: not an actor
        return {}
    base = actor_attributes_of(inst)
    running = cell.running
    return base if running is None else {**base, "danaus.endpoint": running}


# -- spans ----------------------------------------------------------------------------


class Span:
    """A span: ``with span("load"):`` (Monarch's ``PySpan``). Entering starts it as the
    current span (calls made inside carry it, when telemetry is on); leaving ends it,
    recording an exception that escapes as the span's error. While a
    ``danaus.trace(...)`` is running it is recorded there too."""

    __slots__ = ("_span", "_t0", "_token", "name")

    def __init__(self, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise TypeError(f"a span's name must be a non-empty string, got {name!r}")
        self.name = name
        self._span: Any = None
        self._token: Any = None
        self._t0 = 0

    def __enter__(self) -> Span:
        if self._span is not None or self._t0:
            raise RuntimeError(f"span {self.name!r} is already running; make a new one")
        attrs = actor_attributes()
        tracer = _get_tracer()
        if tracer is not None:
            s = self._span = tracer.start_span(self.name, attributes=attrs or None)
            self._token = _context.attach(_otel().set_span_in_context(s))
        rt = _runtime()
        # Timed when a trace runs or the spans table keeps spans (metrics on: rt.recent).
        on = rt is not None and (rt.tracer is not None or rt.recent is not None)
        self._t0 = time.perf_counter_ns() if on else -1
        return self

    def set_attribute(self, key: str, value: Any) -> None:
        """Set an attribute on the running span (a no-op without OpenTelemetry)."""
        if self._span is not None:
            self._span.set_attribute(key, value)

    def add_event(self, name: str, attributes: dict[str, Any] | None = None) -> None:
        """Add an event to the running span (a no-op without OpenTelemetry)."""
        if self._span is not None:
            self._span.add_event(name, attributes)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        s, token, t0 = self._span, self._token, self._t0
        self._span = self._token = None
        self._t0 = 0
        if s is not None:
            _context.detach(token)
            _end(s, exc)
        if t0 > 0:
            rt = _runtime()
            if rt is None:
                return
            args = {k.removeprefix("danaus."): v for k, v in actor_attributes().items()}
            tracer = rt.tracer
            if tracer is not None:
                tracer.span(self.name, "span", t0, args or None)
            recent = rt.recent
            if recent is not None:  # the spans table (danaus.telemetry.query)
                trace_id, span_id, parent_id = ids_of(s) if s is not None else (None,) * 3
                actor = f"{args['mesh']}[{args['rank']}]" if "mesh" in args else None
                if exc is not None:
                    args["error"] = f"{type(exc).__name__}: {exc}"
                recent.span(
                    self.name,
                    t0,
                    time.perf_counter_ns(),
                    actor,
                    trace_id,
                    span_id,
                    parent_id,
                    {**args, "kind": "user"},
                )


def ids_of(s: Any) -> tuple[str | None, str | None, str | None]:
    """An OpenTelemetry span's trace id, span id and parent span id, in hex (the
    spans table's ``trace_id``, ``span_id``, ``parent_id``); Nones for a span
    without a valid context."""
    try:
        sc = s.get_span_context()
        if not sc.is_valid:
            return None, None, None
        parent = getattr(s, "parent", None)
        return (
            format(sc.trace_id, "032x"),
            format(sc.span_id, "016x"),
            format(parent.span_id, "016x") if parent is not None else None,
        )
    except Exception:  # a span of some other provider: keep the row without ids
        return None, None, None


def _runtime() -> Any:
    node = host.current_node()
    return node.runtime if node is not None else None


def _end(s: Any, exc: BaseException | None) -> None:
    if exc is not None:
        from opentelemetry.trace import Status, StatusCode

        s.record_exception(exc)
        s.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
    s.end()


def span(name: str) -> Span:
    """A span named ``name``, as a context manager (Monarch's ``span``)."""
    return Span(name)


_P = TypeVar("_P", bound=Callable[..., Any])


@overload
def traced(fn: _P) -> _P: ...


@overload
def traced(*, name: str) -> Callable[[_P], _P]: ...


def traced(fn: Any = None, *, name: str | None = None) -> Any:
    """Run each call of ``fn`` (sync or async) in a span named ``name`` (default: the
    function's ``__name__``): ``@traced`` or ``@traced(name="step")``, as Monarch's."""

    def decorator(fn: Any) -> Any:
        if not callable(fn):
            raise TypeError(f"traced() decorates a function, got {fn!r}")
        span_name = name if name is not None else fn.__name__
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                with Span(span_name):
                    return await fn(*args, **kwargs)

            return async_wrapper

        @functools.wraps(fn)
        def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
            with Span(span_name):
                return fn(*args, **kwargs)

        return sync_wrapper

    if fn is not None:
        return decorator(fn)
    return decorator


# -- the context a call carries, and the endpoint's span --------------------------------


def outgoing() -> tuple[int, int, int] | None:
    """The context a call made here carries: the current span's, or None outside spans.
    Called on each send while telemetry is on."""
    trace = _trace
    if not trace:
        return None
    sc = trace.get_current_span().get_span_context()
    if not sc.is_valid:
        return None
    return (sc.trace_id, sc.span_id, int(sc.trace_flags))


def endpoint_span(cell: Any, prop: Any, carried: Any) -> Any:
    """Start the span of endpoint ``prop`` of ``cell``'s actor (named for the method,
    as Monarch names it), child of the caller's span ``carried`` (a CALL header's
    ``trace``), as the current span; with ``@endpoint(instrument=False)`` no span,
    but the caller's context is current (spans and calls inside still nest under
    it). Returns what :func:`end_endpoint_span` takes, or None (no OpenTelemetry,
    or a malformed context: the call runs untraced)."""
    if _cannot_start:
        return None  # tried once and failed: every later traced call runs untraced at once
    try:
        return _start_endpoint_span(cell, prop, carried)
    except Exception as e:  # never fail the call because tracing did: it runs untraced
        _tracing_failed(e)
        return None


def _tracing_failed(e: BaseException) -> None:
    global _tracing_errors
    if _tracing_errors == 0:
        log.warning("tracing an endpoint failed; calls go on untraced: %s: %s", type(e).__name__, e)
    else:
        log.debug("tracing an endpoint failed: %s: %s", type(e).__name__, e)
    _tracing_errors += 1


def _start_endpoint_span(cell: Any, prop: Any, carried: Any) -> Any:
    global _cannot_start
    if not ON:
        try:
            enable()
        except Exception as e:  # no OpenTelemetry, or a bad OTEL_* exporter setting
            log.warning("a traced call arrived, but telemetry cannot start here: %s", e)
            _cannot_start = True
            return None
    if (
        type(carried) is not tuple
        or len(carried) != 3
        or not all(type(x) is int and x >= 0 for x in carried)
    ):
        log.debug("a call carried a malformed trace context %.100r; not traced", carried)
        return None
    trace = _otel()
    tracer = _get_tracer()
    if trace is None or tracer is None:
        return None
    trace_id, span_id, flags = carried
    parent = trace.SpanContext(
        trace_id, span_id, is_remote=True, trace_flags=trace.TraceFlags(flags & 0xFF)
    )
    if not parent.is_valid:
        return None
    ctx = trace.set_span_in_context(trace.NonRecordingSpan(parent))
    if not prop.instrument:
        return None, _context.attach(ctx)
    inst = cell.ctx_instance
    endpoint = prop.name
    attrs = {**actor_attributes_of(inst), "danaus.endpoint": endpoint}
    attrs["rpc.system"] = "danaus"
    attrs["rpc.service"] = inst.class_name
    attrs["rpc.method"] = endpoint
    s = tracer.start_span(endpoint, context=ctx, kind=trace.SpanKind.SERVER, attributes=attrs)
    return s, _context.attach(trace.set_span_in_context(s))


def actor_attributes_of(inst: Any) -> dict[str, Any]:
    """The attributes of actor instance ``inst`` (as ``actor_attributes``, no endpoint)."""
    base = _attrs_of.get(inst)
    if base is None:
        aid = inst.actor_id
        base = _attrs_of[inst] = {
            "danaus.actor": str(aid),
            "danaus.actor.class": inst.class_name,
            "danaus.mesh": inst.name,
            "danaus.rank": aid.rank,
            "danaus.proc": aid.proc.name,
        }
    return base


def end_endpoint_span(active: Any, exc: BaseException | None) -> None:
    """End what :func:`endpoint_span` started (on the same thread or task)."""
    try:
        s, token = active
        _context.detach(token)
        if s is not None:
            _end(s, exc)
    except Exception as e:  # the call's outcome stands, whatever its span's end did
        _tracing_failed(e)


# -- metrics --------------------------------------------------------------------------


class _NoOpInstrument:
    """A counter, up-down counter, histogram or gauge that records nothing."""

    def __init__(self, name: str, *args: Any, **kwargs: Any) -> None:
        self.name = name

    def add(self, amount: float, attributes: Any = None, context: Any = None) -> None:
        pass

    def record(self, amount: float, attributes: Any = None, context: Any = None) -> None:
        pass

    set = record


class _NoOpMeter:
    """``get_meter()`` without OpenTelemetry: every instrument records nothing."""

    name = "danaus"

    def create_counter(self, name: str, unit: str = "", description: str = "") -> Any:
        return _NoOpInstrument(name)

    create_up_down_counter = create_histogram = create_gauge = create_counter

    def create_observable_counter(
        self, name: str, callbacks: Any = None, unit: str = "", description: str = ""
    ) -> Any:
        return _NoOpInstrument(name)

    create_observable_gauge = create_observable_up_down_counter = create_observable_counter


_NOOP_METER = _NoOpMeter()


def get_meter() -> Any:
    """The process's ``"danaus"`` OpenTelemetry meter (Monarch's ``get_meter``): its
    counters, histograms and gauges go to the global meter provider, which
    :func:`enable` sets up to export. Without OpenTelemetry, a meter whose
    instruments record nothing."""
    try:
        from opentelemetry import metrics
    except ImportError:
        return _NOOP_METER
    return metrics.get_meter("danaus")


# The built-in endpoint metrics as OpenTelemetry instruments, made at the first call
# measured while telemetry is on. Calls and errors are observable counters read from
# the cells' own counters when the SDK collects (nothing on the hot path: the SDK's
# add() and record() cost ~18 us a call together); the latency histogram is recorded
# (~7 us each) for the calls sampled for the messages table (and traced ones) only, so
# its cost is bounded by query_messages_per_s. Each actor's attributes per endpoint are made once.
_instruments: Any = None  # the latency histogram, once made
_runtimes: weakref.WeakSet[Any] = weakref.WeakSet()  # the runtimes whose cells are read
_ep_attrs: weakref.WeakKeyDictionary[Any, dict[str, dict[str, Any]]] = weakref.WeakKeyDictionary()


def _endpoint_attributes(cell: Any, endpoint: str) -> dict[str, Any]:
    per = _ep_attrs.get(cell)
    if per is None:
        per = _ep_attrs[cell] = {}
    attrs = per.get(endpoint)
    if attrs is None:
        inst = cell.ctx_instance
        base = actor_attributes_of(inst) if inst is not None else {}
        attrs = per[endpoint] = {k: v for k, v in base.items() if k != "danaus.actor"} | {
            "danaus.endpoint": endpoint
        }
    return attrs


def _observe(field: str) -> Callable[[Any], list[Any]]:
    """A callback observing ``field`` (calls, errors) of every endpoint of every cell."""

    def callback(options: Any) -> list[Any]:
        from opentelemetry.metrics import Observation

        out = []
        for rt in list(_runtimes):
            for mb in list(rt.mailboxes.values()):
                stats = getattr(mb, "stats", None)
                if not stats or getattr(mb, "ctx_instance", None) is None:
                    continue
                for endpoint, st in list(stats.items()):
                    out.append(Observation(getattr(st, field), _endpoint_attributes(mb, endpoint)))
        return out

    return callback


def _endpoint_instruments() -> Any:
    global _instruments
    if _instruments is None:
        meter = get_meter()
        meter.create_observable_counter(
            "danaus.endpoint.calls",
            callbacks=[_observe("calls")],
            unit="{call}",
            description="Calls an endpoint handled.",
        )
        meter.create_observable_counter(
            "danaus.endpoint.errors",
            callbacks=[_observe("errors")],
            unit="{call}",
            description="Calls an endpoint raised on.",
        )
        try:  # the same buckets as Prometheus's (the advisory came in OpenTelemetry 1.23)
            _instruments = meter.create_histogram(
                "danaus.endpoint.latency",
                unit="s",
                description="Seconds an endpoint ran per call (the sampled calls).",
                explicit_bucket_boundaries_advisory=list(BOUNDS),
            )
        except TypeError:
            _instruments = meter.create_histogram(
                "danaus.endpoint.latency",
                unit="s",
                description="Seconds an endpoint ran per call (the sampled calls).",
            )
    return _instruments


def endpoint_measured(cell: Any, endpoint: str, seconds: float) -> None:
    """One call of ``endpoint`` of ``cell``'s actor that was sampled for the messages
    table or traced, while telemetry is on (the actor's thread): its latency goes to
    the histogram ``danaus.endpoint.latency``, and the proc's calls and errors are
    observed by ``danaus.endpoint.calls`` and ``.errors`` from then on. Attributes:
    ``danaus.mesh``, ``danaus.actor.class``, ``danaus.endpoint``, ``danaus.rank``,
    ``danaus.proc``."""
    try:
        if cell.rt not in _runtimes:
            _runtimes.add(cell.rt)
        _endpoint_instruments().record(seconds, _endpoint_attributes(cell, endpoint))
    except Exception as e:  # never fail the call because a metric did
        _tracing_failed(e)


# -- turning telemetry on -------------------------------------------------------------


def enable() -> None:
    """Turn telemetry on in this process (idempotent): install the SDK's providers
    with the exporters the ``OTEL_*`` variables name, unless the program set its
    own, and carry span contexts in calls from now on. ``ImportError`` naming the
    extra when OpenTelemetry is not installed; ``ValueError`` for an exporter name
    it does not know."""
    global ON, _installed
    if ON:
        return
    with _lock:
        if ON:
            return
        if _otel() is None:
            raise missing("danaus telemetry")
        if not _installed:
            _install_providers()
            _installed = True
        ON = True


def sync_with_config() -> None:
    """Turn telemetry on if the setting ``telemetry`` says so (before spawning, and when
    a proc boots)."""
    if not ON and config.get("telemetry"):
        enable()


def _credential(name: str) -> bool:
    """Whether the ``OTEL_*`` variable ``name`` may carry a credential (the exporters'
    headers hold ``Authorization=...``): it never goes into a spawn frame."""
    return name.endswith("_HEADERS") or any(w in name for w in ("SECRET", "TOKEN", "PASSWORD"))


def env_for_procs() -> dict[str, str]:
    """What a proc spawned from here needs in its environment to turn telemetry on as
    this process did: ``DANAUS_TELEMETRY=1`` and the ``OTEL_*`` variables, except those
    that may carry credentials (``OTEL_EXPORTER_OTLP_*HEADERS``...). Spawn frames cross
    the network (authenticated, readable without TLS) and reach every proc; a proc on
    this host inherits them from the host agent's environment instead, and one on
    another host takes them from its own worker's environment (issue 40). Empty while
    telemetry is off."""
    if not ON:
        return {}
    out = {k: v for k, v in os.environ.items() if k.startswith("OTEL_") and not _credential(k)}
    out["DANAUS_TELEMETRY"] = "1"
    return out


def install(node: Node, boot: dict[str, Any]) -> None:
    """The node's installer: a proc turns telemetry on at boot when its setting says
    so; one without OpenTelemetry logs why, once, and runs untraced."""
    if not boot:
        return
    try:
        sync_with_config()
    except (ImportError, ValueError) as e:
        log.warning("telemetry stays off in proc %s: %s", node.runtime.proc_id.name, e)


def _exporter_names(var: str, endpoint_vars: tuple[str, ...]) -> list[str]:
    raw = os.environ.get(var)
    if raw is None:  # the SDK's default is otlp: used when an endpoint says where
        return ["otlp"] if any(os.environ.get(v) for v in endpoint_vars) else []
    names = [n.strip().lower() for n in raw.split(",") if n.strip()]
    for n in names:
        if n not in ("otlp", "console", "none"):
            raise ValueError(
                f"{var}={raw!r}: danaus knows the exporters 'otlp', 'console' and 'none'"
            )
    return [n for n in names if n != "none"]


def _protocol(signal: str) -> str:
    proto = (
        os.environ.get(f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL")
        or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    )
    if proto not in ("http/protobuf", "grpc"):
        raise ValueError(
            f"OTEL_EXPORTER_OTLP_PROTOCOL={proto!r}: danaus exports over 'http/protobuf' "
            "(the default) or 'grpc'"
        )
    return proto


def _otlp(signal: str) -> Any:
    """The OTLP exporter class for ``signal`` (``TRACES``/``METRICS``), by protocol."""
    kind = "trace_exporter" if signal == "TRACES" else "metric_exporter"
    cls = "OTLPSpanExporter" if signal == "TRACES" else "OTLPMetricExporter"
    if _protocol(signal) == "grpc":
        module, package = f"opentelemetry.exporter.otlp.proto.grpc.{kind}", "grpc"
    else:
        module, package = f"opentelemetry.exporter.otlp.proto.http.{kind}", "http"
    try:
        mod = __import__(module, fromlist=[cls])
    except ImportError as e:
        raise ImportError(
            f"exporting over OTLP needs opentelemetry-exporter-otlp-proto-{package} "
            f"({EXTRA} brings the http one): {e}"
        ) from e
    return getattr(mod, cls)()


def _install_providers() -> None:
    """The SDK's tracer and meter providers, with the exporters of the ``OTEL_*``
    variables, as the global ones (each only if the program has not set its own)."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return
    from opentelemetry import metrics, trace

    try:
        from opentelemetry.sdk.resources import Resource
    except ImportError as e:
        raise missing("danaus telemetry") from e
    attrs: dict[str, Any] = {"process.pid": os.getpid()}
    if not os.environ.get("OTEL_SERVICE_NAME"):
        attrs["service.name"] = "danaus"
    node = host.current_node()
    if node is not None:
        attrs["danaus.proc"] = node.runtime.proc_id.name
    resource = Resource.create(attrs)
    endpoint = "OTEL_EXPORTER_OTLP_ENDPOINT"
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

        tp = TracerProvider(resource=resource)
        names = _exporter_names(
            "OTEL_TRACES_EXPORTER", (endpoint, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        )
        for n in names:
            exporter = _otlp("TRACES") if n == "otlp" else ConsoleSpanExporter()
            tp.add_span_processor(BatchSpanProcessor(exporter))
        trace.set_tracer_provider(tp)
    if type(metrics.get_meter_provider()).__name__ == "_ProxyMeterProvider":
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import (
            ConsoleMetricExporter,
            PeriodicExportingMetricReader,
        )

        names = _exporter_names(
            "OTEL_METRICS_EXPORTER", (endpoint, "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
        )
        readers = [
            PeriodicExportingMetricReader(
                _otlp("METRICS") if n == "otlp" else ConsoleMetricExporter()
            )
            for n in names
        ]
        metrics.set_meter_provider(MeterProvider(resource=resource, metric_readers=readers))
