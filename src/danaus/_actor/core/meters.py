"""Monarch's ``get_meter`` and danaus's built-in endpoint metrics as OpenTelemetry
instruments (calls, errors, and a sampled latency histogram), reported while telemetry
is on; without OpenTelemetry, a meter whose instruments record nothing.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from typing import Any

from ..._runtime.messaging.metrics import BOUNDS
from .span_record import _endpoint_attributes

__all__ = ["get_meter", "measured"]


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
    `enable()` sets up to export. Without OpenTelemetry, a meter whose
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


def _observe(field: str) -> Callable[[Any], list[Any]]:
    """A callback observing ``field`` (calls, errors) of every endpoint of every cell."""

    def callback(options: Any) -> list[Any]:
        from opentelemetry.metrics import Observation

        out = []
        for rt in list(_runtimes):
            for mb in list(rt.router.mailboxes.values()):
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


def measured(
    cell: Any, endpoint: str, seconds: float, failed: Callable[[BaseException], None]
) -> None:
    """One call of ``endpoint`` of ``cell``'s actor that was sampled for the messages
    table or traced, while telemetry is on (the actor's thread): its latency goes to
    the histogram ``danaus.endpoint.latency`` (every such call up to 200 a second per
    process, then 1 in N: the quantiles hold, the count is the sample's), and the
    proc's calls and errors are
    observed by ``danaus.endpoint.calls`` and ``.errors`` from then on. Attributes:
    ``danaus.mesh``, ``danaus.actor.class``, ``danaus.endpoint``, ``danaus.rank``,
    ``danaus.proc``. An error recording it goes to ``failed``, never to the call."""
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
        failed(e)
