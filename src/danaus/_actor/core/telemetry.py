"""OpenTelemetry in actors: Monarch's ``span``, ``traced`` and ``get_meter``, and the
trace context that travels with a call.

``span(name)`` is a context manager that records an OpenTelemetry span through the
global tracer provider (tracer ``"danaus"``); inside an actor it carries the actor,
its rank, mesh, class, proc and endpoint as attributes. ``traced`` wraps a function
(sync or async) in one. ``get_meter()`` is the ``"danaus"`` meter of the global meter
provider. All three work without OpenTelemetry installed, as no-ops (Monarch's work
whatever is configured); the API and SDK come with ``pip install 'danaus[telemetry]'``.

Telemetry is *on* in a process after `enable()` (the setting ``telemetry``,
``JobTrait.enable_telemetry()``, or a traced call arriving): then each call made
inside a span carries that span's context in its CALL (or CAST) header, inside the
authenticated frame, and the endpoint it reaches runs in a span of its own whose
parent is the caller's (named for the method, as Monarch's; kind SERVER; none for
``@endpoint(instrument=False)``). Calls made outside any span carry ``None`` and
their endpoints record nothing. Sampling is OpenTelemetry's parent-based: the root
span's sampler decides (``OTEL_TRACES_SAMPLER``), every process follows the flags
the call carries. An endpoint's span is a few values recorded on the hot path and
exported by a batch thread (``_Exports``: see "endpoint spans" below), not an SDK
span, which costs ~20 µs of Python to make and as much to encode. When telemetry
is off the send path reads one module attribute (`ON`) and the header holds
``None``.

`enable()` installs the SDK's tracer and meter providers (unless the program
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

import contextvars
import functools
import inspect
import logging
import os
import random
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar, overload

from ... import _config as config
from ..._runtime.node import Node, this_node
from . import gpu as _gpu
from . import meters as _meters
from .context import _current, _thread_ctx
from .meters import get_meter
from .otel_setup import EXTRA, _credential, install_providers, missing
from .span_export import Exports as _Exports
from .span_record import _ERROR, _T0, _T1, _new_span, actor_attributes_of, ids_of

# EXTRA, get_meter, ids_of: from otel_setup, meters and span_record, named here too.
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


# -- the actor's attributes (``span_record`` keeps each actor's) ------------------------


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
            ctx = None
            inside = _current_span.get()  # in an endpoint's span: its child
            if inside is not None and not _otel().get_current_span().get_span_context().is_valid:
                ctx = _parent_context(*inside)
            s = self._span = tracer.start_span(self.name, context=ctx, attributes=attrs or None)
            self._token = _context.attach(_otel().set_span_in_context(s))
        rt = _runtime()
        # Timed when a trace runs or the spans table keeps spans (metrics on: rt.observing.recent).
        on = rt is not None and (rt.tracer is not None or rt.observing.recent is not None)
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
            recent = rt.observing.recent
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


def _runtime() -> Any:
    node = this_node(start=False)
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
    """The context a call made here carries: the current span's (an OpenTelemetry span
    opened here, else the endpoint span this code runs in), or None outside spans.
    Called on each send while telemetry is on."""
    global _last
    trace = _trace
    if not trace:
        return None
    cur = trace.get_current_span()
    last = _last
    if cur is last[0]:  # calls made one after another in one span: its context, kept
        return last[1] or _current_span.get()
    sc = cur.get_span_context()
    carried = (sc.trace_id, sc.span_id, int(sc.trace_flags)) if sc.is_valid else None
    _last = (cur, carried)
    return carried or _current_span.get()


# The last current span outgoing() saw, and its context (None: not valid). A span's
# context never changes, so this holds whichever thread reads or replaces it.
_last: tuple[Any, tuple[int, int, int] | None] = (object(), None)


# -- endpoint spans: recorded as tuples, made into OpenTelemetry spans off the hot path --
#
# Starting a span through the SDK costs ~20 us of Python and encoding it for OTLP as
# much again (issue 41: tracing every call cost 55-78 % of throughput). An endpoint's
# span is therefore an _EndpointSpan (its ids and two clock reads), made current
# through a ContextVar that ``outgoing`` and ``span`` read, and handed at its end to
# ``_exports``: a bounded queue that a batch thread of this process encodes to OTLP
# itself (pieces that repeat, the resource and each actor's attributes, are encoded
# once) and posts through the SDK exporter's own HTTP client. When the tracer provider
# has span processors other than danaus's own (a program's in-memory or console
# exporter), the span is made into an SDK ``ReadableSpan`` and given to them at once,
# as the SDK would.

#: The context of the endpoint span the running code is in: (trace id, span id, flags).
_current_span: contextvars.ContextVar[tuple[int, int, int] | None] = contextvars.ContextVar(
    "danaus_endpoint_span", default=None
)
_getrandbits = random.getrandbits
_clock = time.perf_counter_ns


def endpoint_span(cell: Any, prop: Any, carried: Any) -> Any:
    """Start the span of endpoint ``prop`` of ``cell``'s actor (named for the method,
    as Monarch's; kind SERVER) as a child of ``carried``, the caller's context (a call
    made inside a span carries it), and make it current (or, for
    ``@endpoint(instrument=False)``, make the caller's context current without a span of
    its own), turning telemetry on here first if the process had not (a traced call
    reaching a proc that was not spawned with it). Sampled as OpenTelemetry's
    parent-based samplers do: the span is recorded when the caller's flags say
    sampled (the provider's own sampler decides when it is not parent-based); an
    unsampled one still carries the trace to the calls made inside it. Returns what
    `end_endpoint_span()` takes, or None (no OpenTelemetry, or a malformed
    context: the call runs untraced)."""
    if _cannot_start:
        return None  # tried once and failed: every later traced call runs untraced at once
    try:
        if ON and _sampler is None and type(carried) is tuple and len(carried) == 3:
            # The common case, inline: a sampled context, well formed (_start_endpoint_span
            # has the rest, and says what is wrong with a malformed one).
            trace_id, parent_id, flags = carried
            if (
                type(trace_id) is int
                and type(parent_id) is int
                and type(flags) is int
                and flags & 1
                and 0 < trace_id < _TRACE_END
                and 0 < parent_id < _SPAN_END
                and flags < 256
                and prop.instrument
            ):
                span_id = _getrandbits(64) or 1
                return (
                    [trace_id, span_id, parent_id, flags, cell, prop.name, _clock(), 0, None, 2],
                    _current_span.set((trace_id, span_id, flags)),
                )
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
    if type(carried) is tuple and len(carried) == 3:
        trace_id, parent_id, flags = carried
        ok = type(trace_id) is int and type(parent_id) is int and type(flags) is int
    else:
        ok = False
    if not ok or not (0 < trace_id < _TRACE_END and 0 < parent_id < _SPAN_END and flags >= 0):
        log.debug("a call carried a malformed trace context %.100r; not traced", carried)
        return None
    flags &= 0xFF
    if not prop.instrument:
        return None, _current_span.set((trace_id, parent_id, flags))
    span_id = _getrandbits(64) or 1
    sampled = flags & 1 if _sampler is None else _sample(cell, prop.name, carried)
    if not sampled:  # parent-based: not recorded, the trace goes on unsampled
        return None, _current_span.set((trace_id, span_id, flags & 0xFE))
    return (
        [trace_id, span_id, parent_id, flags | 1, cell, prop.name, _clock(), 0, None, 2],
        _current_span.set((trace_id, span_id, flags | 1)),
    )


_TRACE_END = 1 << 128
_SPAN_END = 1 << 64


def end_endpoint_span(active: Any, exc: BaseException | None) -> None:
    """End what `endpoint_span()` started (on the same thread or task)."""
    try:
        s, token = active
        _current_span.reset(token)
        if s is not None:
            s[_T1] = _clock()
            s[_ERROR] = exc
            ex = _exports
            if ex.fast and ex.active._span_processors is ex.seen:  # the common case, inline
                q = ex.queue
                if len(q) == q.maxlen:
                    ex.dropped += 1
                q.append(s)
                if len(q) >= ex.batch and not ex.woken:
                    ex.woken = True  # once: the thread may take a while to get the GIL
                    ex.wake.set()
            else:
                ex.add(s)
    except Exception as e:  # the call's outcome stands, whatever its span's end did
        _tracing_failed(e)


def transfer_started(done: Any, what: str, nbytes: int) -> None:
    """A data-plane transfer began here (``RDMABuffer.read_into``/``write_from``): when
    it runs inside a span (an endpoint's, or one the program opened), it gets a span of
    its own, kind INTERNAL, named ``rdma.transfer``, ended when ``done`` (a
    ``concurrent.futures.Future``) completes: in the spans table and exported. Costs one
    attribute read while telemetry is off or no span is current. Counted for the
    ``transfers`` of the proc's metrics either way (``gpu.transfer_started``)."""
    _gpu.transfer_started(done, nbytes)
    if not ON:
        return
    try:
        carried = outgoing()
        if carried is None or not carried[2] & 1:
            return
        trace_id, parent_id, flags = carried
        attrs = {**actor_attributes(), "danaus.transfer": what, "danaus.transfer.bytes": nbytes}
        s = _new_span(trace_id, _getrandbits(64) or 1, parent_id, flags, attrs, "rdma.transfer", 1)
        rt = _runtime()

        def ended(f: Any) -> None:
            s[_T1] = time.perf_counter_ns()
            s[_ERROR] = error = f.exception()
            _exports.add(s)
            recent = rt.observing.recent if rt is not None else None
            if recent is not None:
                actor = None
                if "danaus.mesh" in attrs:
                    actor = f"{attrs['danaus.mesh']}[{attrs['danaus.rank']}]"
                row = {k.removeprefix("danaus."): v for k, v in attrs.items()}
                row["kind"] = "transfer"
                if error is not None:
                    row["error"] = f"{type(error).__name__}: {error}"
                recent.span("rdma.transfer", s[_T0], s[_T1], actor, *ids_of(s), row)

        done.add_done_callback(ended)
    except Exception as e:  # never fail a transfer because tracing did
        _tracing_failed(e)


def _parent_context(trace_id: int, span_id: int, flags: int) -> Any:
    """An OpenTelemetry context whose current span is (trace_id, span_id, flags)."""
    trace = _otel()
    sc = trace.SpanContext(trace_id, span_id, is_remote=False, trace_flags=trace.TraceFlags(flags))
    return trace.set_span_in_context(trace.NonRecordingSpan(sc))


#: The provider's sampler when it is not parent-based as the SDK's default is (then it
#: decides each endpoint span, as the SDK would); None: the caller's flags decide.
_sampler: Any = None


def _sample(cell: Any, endpoint: str, carried: tuple[int, int, int]) -> int:
    trace = _otel()
    trace_id, parent_id, flags = carried
    parent = trace.SpanContext(
        trace_id, parent_id, is_remote=True, trace_flags=trace.TraceFlags(flags & 0xFF)
    )
    ctx = trace.set_span_in_context(trace.NonRecordingSpan(parent))
    result = _sampler.should_sample(ctx, trace_id, endpoint, trace.SpanKind.SERVER, None)
    return 1 if result.decision.is_sampled() else 0


def _set_sampler(sampler: Any) -> None:
    global _sampler
    _sampler = sampler


_exports = _Exports(_set_sampler)


def flush() -> None:
    """Export the endpoint spans this process still holds (the provider's
    ``force_flush`` and ``shutdown`` do this too, as does the end of the process)."""
    _exports.flush()


def endpoint_measured(cell: Any, endpoint: str, seconds: float) -> None:
    """One call of ``endpoint`` of ``cell``'s actor sampled for the messages table or
    traced, while telemetry is on: its latency to the endpoint metrics
    (``meters.measured``); an error doing so is logged as a tracing error."""
    _meters.measured(cell, endpoint, seconds, _tracing_failed)


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
            install_providers(_exports)
            _installed = True
        _exports._decide()  # the provider's sampler, and where endpoint spans go
        ON = True


def sync_with_config() -> None:
    """Turn telemetry on if the setting ``telemetry`` says so (before spawning, and when
    a proc boots)."""
    if not ON and config.get("telemetry"):
        enable()


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
    so; one without OpenTelemetry logs why, once, and runs untraced. Every node
    (the client's too) answers its GPU activity and transfers under ``"gpu"`` in
    ``STATS`` (``gpu.observe``)."""
    node.runtime.observing.observers.setdefault("gpu", _gpu.observe)
    if not boot:
        return
    try:
        sync_with_config()
    except (ImportError, ValueError) as e:
        log.warning("telemetry stays off in proc %s: %s", node.runtime.proc_id.name, e)
