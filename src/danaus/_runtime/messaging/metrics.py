"""What a proc measures about itself: endpoint metrics and trace spans (no I/O).

The hot path stays cheap. An endpoint's metrics are a few integers and a
fixed-bucket latency histogram, updated on the actor's own thread (no lock:
only that thread writes them; a reader on the I/O thread may see a count one
call behind, never a broken one). Spans are recorded only while a trace is
running (``Runtime.tracer`` is not None); otherwise the only cost is that
check. Collection happens on demand: the ``STATS`` and ``TRACE_STOP`` frames
ask a proc's I/O thread for a snapshot (``danaus._actor.tools.introspect``).

Timestamps are ``time.perf_counter_ns()`` (CLOCK_MONOTONIC on Linux), which
every process of a host shares; the collector aligns hosts by the offset it
measures when it starts a trace.
"""

from __future__ import annotations

import bisect
import collections
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

__all__ = [
    "BOUNDS",
    "RATIO",
    "EndpointStats",
    "MessageRow",
    "Observing",
    "Recent",
    "Tracer",
    "percentile",
]

#: How much wider each latency bucket is than the one before: 2^(1/8), about 9 %, so a
#: quantile interpolated anywhere within its bucket (as Prometheus's
#: ``histogram_quantile`` does) is off by less than 10 % whatever the latencies' spread,
#: even all in one bucket (issue 41: 2 buckets per decade were off by up to 2x).
RATIO = 2 ** (1 / 8)

#: Upper bounds (seconds) of the latency buckets: 8 per octave (about 27 per decade)
#: from 1 µs to 113 s; one more bucket holds what is slower.
BOUNDS: tuple[float, ...] = tuple(1e-6 * RATIO**k for k in range(8 * 27))


class EndpointStats:
    """Calls, errors and a latency histogram of one endpoint of one actor."""

    __slots__ = ("calls", "counts", "errors", "max", "total")

    def __init__(self) -> None:
        self.calls = 0
        self.errors = 0
        self.total = 0.0  # seconds, summed
        self.max = 0.0
        self.counts = [0] * (len(BOUNDS) + 1)

    def record(self, seconds: float, ok: bool) -> None:
        """One call that took ``seconds`` (actor thread only)."""
        self.calls += 1
        if not ok:
            self.errors += 1
        self.total += seconds
        if seconds > self.max:
            self.max = seconds
        self.counts[bisect.bisect_left(BOUNDS, seconds)] += 1

    def snapshot(self) -> dict[str, Any]:
        """A plain-data copy (picklable, JSON-able): sparse bucket counts."""
        counts = list(self.counts)
        return {
            "calls": self.calls,
            "errors": self.errors,
            "total_s": self.total,
            "max_s": self.max,
            "buckets": {i: c for i, c in enumerate(counts) if c},
        }


class MessageRow:
    """One handled call sampled for the messages table (``Recent.messages``).

    Made when the call is delivered (``arrived_ns``, ``stride``); its actor fills
    in the call when it takes it, the times when its body ends and
    ``reply_bytes`` once the reply is written. It iterates as
    the plain row the ``TELEMETRY`` answer carries, in field order.
    """

    #: The fields, in the order of the plain row.
    FIELDS = (
        "arrived_ns",
        "started_ns",
        "ended_ns",
        "mesh_id",
        "rank",
        "endpoint",
        "sender",
        "request_bytes",
        "reply_bytes",
        "ok",
        "stride",
    )
    __slots__ = FIELDS

    def __init__(self, arrived_ns: int, stride: int) -> None:
        self.arrived_ns = arrived_ns
        self.stride = stride  # recorded 1 in ``stride`` (``Recent.take``)
        self.started_ns = self.ended_ns = 0
        self.mesh_id: str | None = None
        self.rank = 0
        self.endpoint: str | None = None
        self.sender: str | None = None
        self.request_bytes = 0
        self.reply_bytes: int | None = None  # filled in after the reply is sent
        self.ok = True

    def __iter__(self) -> Iterator[Any]:
        return iter([getattr(self, f) for f in self.FIELDS])

    def __repr__(self) -> str:
        return f"MessageRow({', '.join(f'{f}={getattr(self, f)!r}' for f in self.FIELDS)})"


def percentile(buckets: dict[int, int], q: float) -> float | None:
    """The ``q``-th percentile (0-100) of a bucketed latency, in seconds (None if empty).

    Within a bucket the value is interpolated geometrically between its bounds,
    so the error is at most the bucket's width (about 9 %, ``RATIO``).
    """
    n = sum(buckets.values())
    if n == 0:
        return None
    rank = q / 100.0 * n
    seen = 0
    for i in sorted(buckets):
        c = buckets[i]
        if seen + c >= rank:
            hi = BOUNDS[i] if i < len(BOUNDS) else BOUNDS[-1] * 10
            lo = BOUNDS[i - 1] if i > 0 else hi / RATIO
            frac = (rank - seen) / c if c else 1.0
            return float(lo * (hi / lo) ** frac)
        seen += c
    return BOUNDS[-1] * 10  # pragma: no cover - rank <= n always stops above


class Tracer:
    """The spans one proc records while a trace runs. Appends from any thread.

    Events are tuples, turned into Chrome trace events by the collector:
    ``("X", name, cat, t0_ns, dur_ns, tid, args, flow_in, flow_out)`` for a
    span on a thread, ``("b"|"e", name, cat, t_ns, async_id, tid, args)`` for
    the two ends of a span that crosses threads (a client call). Flow keys are
    strings that the span starting an arrow (``flow_out``) and the one ending it
    (``flow_in``) share, across processes.
    """

    def __init__(self, max_events: int) -> None:
        self.events: list[tuple[Any, ...]] = []
        self.max_events = max_events
        self.dropped = 0
        self.threads: dict[int, str] = {}
        self.started_ns = time.perf_counter_ns()
        self.late: list[Any] = []  # procs spawned during the trace, started as they came

    now = staticmethod(time.perf_counter_ns)

    def _tid(self) -> int:
        tid = threading.get_native_id()
        if tid not in self.threads:
            self.threads[tid] = threading.current_thread().name
        return tid

    def span(
        self,
        name: str,
        cat: str,
        t0: int,
        args: dict[str, Any] | None = None,
        flow_in: str | None = None,
        flow_out: str | tuple[str, ...] | None = None,
    ) -> None:
        """A span from ``t0`` (``now()``) until now, on the calling thread."""
        t1 = time.perf_counter_ns()
        if len(self.events) >= self.max_events:
            self.dropped += 1
            return
        self.events.append(("X", name, cat, t0, t1 - t0, self._tid(), args, flow_in, flow_out))

    def begin(self, name: str, cat: str, async_id: str, args: dict[str, Any] | None = None) -> None:
        """The start of a span that ends on another thread (``end`` with the same id)."""
        self._edge("b", name, cat, async_id, args)

    def end(self, name: str, cat: str, async_id: str, args: dict[str, Any] | None = None) -> None:
        self._edge("e", name, cat, async_id, args)

    def _edge(
        self, ph: str, name: str, cat: str, async_id: str, args: dict[str, Any] | None
    ) -> None:
        if len(self.events) >= self.max_events:
            self.dropped += 1
            return
        t = time.perf_counter_ns()
        self.events.append((ph, name, cat, t, async_id, self._tid(), args))

    def drain(self) -> dict[str, Any]:
        """Everything recorded, as plain data (the tracer is done after this)."""
        events, self.events = self.events, []
        return {"events": events, "threads": dict(self.threads), "dropped": self.dropped}


class Recent:
    """What one proc keeps of its recent past for ``danaus.telemetry.query``: rings
    (bounded deques) of handled messages, spans and ended actors.

    ``messages`` rows are `MessageRow` records (the actor's thread
    appends them; ``reply_bytes`` is filled in after the reply is sent), copied
    out as lists ``[arrived_ns, started_ns, ended_ns, mesh_id, rank, endpoint,
    sender, request_bytes, reply_bytes, ok, stride]``. When messages come
    faster than ``per_s`` a second, only one in ``stride`` is recorded
    (``take``); each row says the stride it was taken under, so a count can be
    scaled back. ``spans`` rows are tuples
    ``(name, start_ns, end_ns, actor, trace_id, span_id, parent_id, attributes)``;
    ``ended`` holds the rows of actors that stopped or failed here (dicts).
    Every append is a ``deque.append`` (atomic, any thread, O(1)).
    """

    CHECK_EVERY = 128  # messages between two estimates of the rate

    def __init__(
        self, size: int, per_s: int, clock: Callable[[], int] = time.perf_counter_ns
    ) -> None:
        if size < 1:
            raise ValueError(f"a telemetry ring holds at least 1 row, not {size}")
        self.size = size
        self.per_s = per_s
        self.messages: collections.deque[MessageRow] = collections.deque(maxlen=size)
        self.spans: collections.deque[tuple[Any, ...]] = collections.deque(maxlen=size)
        self.ended: collections.deque[dict[str, Any]] = collections.deque(maxlen=size)
        self.stride = 1
        self.seen = 0  # messages offered to take(), recorded or not
        self._check_at = self.CHECK_EVERY
        self._clock = clock
        self._checked_ns = clock()
        self._checked_seen = 0

    def take(self) -> int:
        """0 to leave this message out, else the stride in force (record 1 in ``stride``).

        Called for each message delivered to an actor; races between threads
        only blur the rate estimate, never break it.
        """
        self.seen += 1
        seen = self.seen
        if seen >= self._check_at:
            self._retune(seen)
        stride = self.stride
        if stride == 1 or seen % stride == 0:
            return stride
        return 0

    def _retune(self, seen: int) -> None:
        now = self._clock()
        dt = now - self._checked_ns
        rate = (seen - self._checked_seen) * 1e9 / dt if dt > 0 else float("inf")
        if self.per_s <= 0 or rate <= self.per_s:
            self.stride = 1
        else:
            self.stride = max(1, int(rate // self.per_s) + (rate % self.per_s > 0))
        self._checked_ns, self._checked_seen = now, seen
        self._check_at = seen + self.CHECK_EVERY

    def span(
        self,
        name: str,
        start_ns: int,
        end_ns: int,
        actor: str | None = None,
        trace_id: str | None = None,
        span_id: str | None = None,
        parent_id: str | None = None,
        attributes: dict[str, Any] | None = None,
    ) -> None:
        """Keep one finished span (times are ``time.perf_counter_ns()``)."""
        self.spans.append((name, start_ns, end_ns, actor, trace_id, span_id, parent_id, attributes))

    def copy(self) -> dict[str, Any]:
        """A copy of the rings as plain data, with the clocks to read their times by."""
        return {
            "messages": [list(r) for r in _items(self.messages)],
            "spans": _items(self.spans),
            "ended": _items(self.ended),
            "seen": self.seen,
            "size": self.size,
            "now_ns": time.perf_counter_ns(),
            "now_s": time.time(),
        }


def _items(ring: collections.deque[Any]) -> list[Any]:
    """The items of a deque that other threads append to (a copy, retried if it moved)."""
    for _ in range(100):
        try:
            return list(ring)
        except RuntimeError:  # "deque mutated during iteration"
            continue
    return []


class Observing:
    """What one runtime records of itself (``rt.observing``): whether endpoint metrics
    are on, the recent rings ``danaus.telemetry.query`` reads (with metrics), and the
    sections other layers add to this proc's STATS snapshot (name -> plain data)."""

    def __init__(self, metrics: bool, ring_size: int, messages_per_s: int) -> None:
        self.metrics = metrics
        self.recent: Recent | None = Recent(ring_size, messages_per_s) if metrics else None
        self.observers: dict[str, Callable[[], Any]] = {}
