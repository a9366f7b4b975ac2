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
``@endpoint(instrument=False)``). Calls made outside any span carry ``None`` and
their endpoints record nothing. Sampling is OpenTelemetry's parent-based: the root
span's sampler decides (``OTEL_TRACES_SAMPLER``), every process follows the flags
the call carries. An endpoint's span is a few values recorded on the hot path and
exported by a batch thread (``_Exports``: see "endpoint spans" below), not an SDK
span, which costs ~20 µs of Python to make and as much to encode. When telemetry
is off the send path reads one module attribute (:data:`ON`) and the header holds
``None``.

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

import collections
import contextvars
import functools
import inspect
import logging
import os
import random
import struct
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
from . import gpu as _gpu
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
            ctx = None
            inside = _current_span.get()  # in an endpoint's span: its child
            if inside is not None and not _otel().get_current_span().get_span_context().is_valid:
                ctx = _parent_context(*inside)
            s = self._span = tracer.start_span(self.name, context=ctx, attributes=attrs or None)
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
    without a valid context. Of danaus's own endpoint spans, the ids as ints (the
    table formats them when it is read: nothing formatted per call)."""
    if type(s) is list:  # danaus's endpoint span: ints, formatted when the table is read
        return s[_TRACE], s[_SPAN], s[_PARENT]
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


# An endpoint's span (or a transfer's), as recorded on the hot path: a list (made and
# filled faster than any object) of these fields.
_TRACE, _SPAN, _PARENT, _FLAGS = 0, 1, 2, 3  # ids (ints) and trace flags
_CELL = 4  # the actor's cell (its attributes are made from it), or a transfer's attributes
_NAME = 5  # the span's name: the endpoint's (the method), or "rdma.transfer"
_T0, _T1 = 6, 7  # start and end, time.perf_counter_ns()
_ERROR = 8  # the exception that ended it, or None
_KIND = 9  # OTLP's span kind: 2 (SERVER) for an endpoint, 1 (INTERNAL) for a transfer
_EndpointSpan = list[Any]


def _new_span(
    trace_id: int, span_id: int, parent_id: int, flags: int, cell: Any, name: str, kind: int = 2
) -> list[Any]:
    return [trace_id, span_id, parent_id, flags, cell, name, time.perf_counter_ns(), 0, None, kind]


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
    :func:`end_endpoint_span` takes, or None (no OpenTelemetry, or a malformed
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
    """End what :func:`endpoint_span` started (on the same thread or task)."""
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
            recent = rt.recent if rt is not None else None
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


def _find_sampler(provider: Any) -> Any:
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


class _Exports:
    """Where ended endpoint spans go (the process's one instance, ``_exports``).

    ``add`` (the hot path) appends to a bounded queue (``OTEL_BSP_MAX_QUEUE_SIZE``,
    16384: beyond it the oldest are dropped and counted) when this process exports
    over OTLP/HTTP through danaus's own provider; a batch thread wakes every
    ``OTEL_BSP_SCHEDULE_DELAY`` ms (5000), or once ``OTEL_BSP_MAX_EXPORT_BATCH_SIZE``
    (4096) wait, and posts them, that many a request. With other span processors on the provider (a
    program's own exporter) each span is made an SDK ``ReadableSpan`` and given to
    them at once; with none, nothing is exported (the spans table still has it).
    """

    def __init__(self) -> None:
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
        if procs is not self.seen or not provider or _trace.get_tracer_provider() is not provider:
            self._decide()
        return self.mode

    def _decide(self) -> None:
        global _sampler
        trace = _otel()
        provider = trace.get_tracer_provider() if trace is not None else None
        active = getattr(provider, "_active_span_processor", None)
        procs = getattr(active, "_span_processors", None)
        self.provider, self.seen, self.active = provider, procs, active
        self.fast = False
        self._head = None
        self._pieces = weakref.WeakKeyDictionary()
        _sampler = _find_sampler(provider)
        if procs is None:
            self.mode = "none"  # not the SDK's provider: nothing to hand spans to
        elif provider is _ours.get("provider") and set(procs) <= _ours["processors"]:
            self.exporters = list(_ours["fast"])
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


_exports = _Exports()
# What danaus installed (``_install_providers``): its tracer provider, the span
# processors it added, and the OTLP/HTTP exporters the batch thread posts through.
_ours: dict[str, Any] = {"provider": None, "processors": set(), "fast": []}


def flush() -> None:
    """Export the endpoint spans this process still holds (the provider's
    ``force_flush`` and ``shutdown`` do this too, as does the end of the process)."""
    _exports.flush()


class _Flusher:
    """A span processor of danaus's provider that does nothing per span; the
    provider's ``force_flush`` and ``shutdown`` (at exit) export the endpoint spans
    waiting in ``_exports``."""

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        pass

    def on_end(self, span: Any) -> None:
        pass

    def _on_ending(self, span: Any) -> None:
        pass

    def shutdown(self) -> None:
        _exports.flush()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        _exports.flush()
        return True


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
# its cost is bounded by _LATENCY_PER_S. Each actor's attributes per endpoint are made once.
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


# The latency histogram's own sampling (the process's): every call up to _LATENCY_PER_S a
# second, then 1 in _measured_stride, re-estimated every 128 calls. A record costs the
# SDK ~7 us; 200 a second keep the histogram's quantiles and cost ~0.1 % of a core.
_LATENCY_PER_S = 200
_measured_seen = 0
_measured_stride = 1
_measured_check = [128, time.perf_counter_ns(), 0]  # next check at, last check's time and count


def _measured_retune(seen: int) -> None:
    global _measured_stride
    now = time.perf_counter_ns()
    _, then, then_seen = _measured_check
    dt = now - then
    rate = (seen - then_seen) * 1e9 / dt if dt > 0 else float("inf")
    per_s = _LATENCY_PER_S
    _measured_stride = 1 if per_s <= 0 or rate <= per_s else max(1, -int(-rate // per_s))
    _measured_check[:] = [seen + 128, now, seen]


def endpoint_measured(cell: Any, endpoint: str, seconds: float) -> None:
    """One call of ``endpoint`` of ``cell``'s actor that was sampled for the messages
    table or traced, while telemetry is on (the actor's thread): its latency goes to
    the histogram ``danaus.endpoint.latency`` (every such call up to 200 a second per
    process, then 1 in N: the quantiles hold, the count is the sample's), and the
    proc's calls and errors are
    observed by ``danaus.endpoint.calls`` and ``.errors`` from then on. Attributes:
    ``danaus.mesh``, ``danaus.actor.class``, ``danaus.endpoint``, ``danaus.rank``,
    ``danaus.proc``."""
    global _measured_seen, _measured_stride
    _measured_seen += 1
    seen = _measured_seen
    if seen >= _measured_check[0]:
        _measured_retune(seen)
    if _measured_stride > 1 and seen % _measured_stride:
        return  # above _LATENCY_PER_S a second: 1 in stride (every traced call comes here)
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
        _exports._decide()  # the provider's sampler, and where endpoint spans go
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
    so; one without OpenTelemetry logs why, once, and runs untraced. Every node
    (the client's too) answers its GPU activity and transfers under ``"gpu"`` in
    ``STATS`` (``gpu.observe``)."""
    node.runtime.observers.setdefault("gpu", _gpu.observe)
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
        # First, so that at exit the endpoint spans go out before the exporters shut.
        flusher = _Flusher()
        tp.add_span_processor(flusher)  # type: ignore[arg-type]
        processors: set[Any] = {flusher}
        fast = []
        for n in names:
            exporter = _otlp("TRACES") if n == "otlp" else ConsoleSpanExporter()
            bsp = BatchSpanProcessor(exporter)
            tp.add_span_processor(bsp)
            processors.add(bsp)
            if n == "otlp" and _protocol("TRACES") == "http/protobuf":
                fast.append(_otlp("TRACES"))  # endpoint spans, encoded by _Exports
            elif n == "otlp" or n == "console":
                fast = []
                processors.discard(bsp)  # needs SDK spans: endpoint spans go the SDK's way
        _ours.update(provider=tp, processors=processors, fast=fast)
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
