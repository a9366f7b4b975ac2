"""Asking procs what they hold: statistics, traces and stack dumps, and ``mesh.stats()``.

Every runtime answers ``STATS``, ``TRACE_START``, ``TRACE_STOP`` and ``STACK``
on its I/O thread (``danaus._actor.tools.introspect``, installed by the
bootstrap). The asking side here (``gather``) sends one frame per proc and waits
for the answers up to a timeout; a proc that is lost or does not answer in time
is reported as such, never waited for. ``ProcMesh.stats()`` and
``danaus.stats()`` build on it (``mesh_stats``); ``danaus._observe`` serves the
rest.
"""

from __future__ import annotations

import concurrent.futures
import functools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ... import _config as config
from ..._runtime.messaging.metrics import BOUNDS, percentile
from ..._runtime.messaging.runtime import Runtime
from ..._wire.ids import ProcId
from ..._wire.protocol import Stack, Stats, Telemetry, TraceStart, TraceStop
from ..core.collect import Collector

__all__ = [
    "ConnectionStats",
    "EndpointMetrics",
    "MeshStats",
    "ProcStats",
    "ask_stacks",
    "ask_stats",
    "ask_trace_start",
    "ask_trace_stop",
    "gather",
    "mesh_stats",
]


# -- the asking side ------------------------------------------------------------------


def gather(
    rt: Runtime,
    procs: Sequence[ProcId],
    make: Callable[[Any, int], Any],
    timeout: float,
    what: str,
    arrived: list[int] | None = None,
) -> concurrent.futures.Future[list[tuple[bool, Any]]]:
    """Send ``make(port, slot)`` to each proc (peers of ``rt``); completes with ``(ok,
    answer or why)`` each.

    Never waits for more than ``timeout`` seconds: a proc that has not answered
    by then, or is lost, gets ``(False, "why")``. Does not block. ``arrived``
    (one slot per proc) receives each answer's ``perf_counter_ns()`` arrival.
    """
    cf: concurrent.futures.Future[list[tuple[bool, Any]]] = concurrent.futures.Future()
    results: list[tuple[bool, Any] | None] = [None] * len(procs)
    lock = threading.Lock()  # guards results and left (against finish() completing cf)
    left = [len(procs)]

    def finish() -> None:
        with lock:
            if cf.done():
                return
            out = [
                r if r is not None else (False, f"no answer within {timeout:g} s") for r in results
            ]
        cf.set_result(out)

    if not procs:
        cf.set_result([])
        return cf

    def on_value(index: int, ok: bool, value: Any) -> None:
        if arrived is not None:
            arrived[index] = time.perf_counter_ns()
        with lock:
            if results[index] is not None:
                return
            results[index] = (ok, value if ok else str(value))
            left[0] -= 1
            last = left[0] == 0
        if last:
            finish()

    collector = Collector(rt, what, len(procs), on_value)

    def expire() -> None:
        if not cf.done():
            rt.router.close_port(collector.port.port)
            rt.peers.unwatch(collector.watched, collector.port.port)
            finish()

    rt.call_soon(lambda: rt.loop.call_later(timeout, expire))
    for i, p in enumerate(procs):
        collector.expect(i, p, f"proc {p.name}")
    for i, p in enumerate(procs):
        rt.send(p, make(collector.port, i), on_fail=functools.partial(collector.fail, i))
    return cf


def ask_stats(
    rt: Runtime, procs: Sequence[ProcId]
) -> concurrent.futures.Future[list[tuple[bool, Any]]]:
    return gather(rt, procs, Stats, config.get("stats_timeout"), "stats")


def ask_recent(
    rt: Runtime, procs: Sequence[ProcId]
) -> concurrent.futures.Future[list[tuple[bool, Any]]]:
    """Each proc's telemetry rings (``introspect.recent``)."""
    return gather(rt, procs, Telemetry, config.get("stats_timeout"), "telemetry")


def ask_stacks(
    rt: Runtime, procs: Sequence[ProcId]
) -> concurrent.futures.Future[list[tuple[bool, Any]]]:
    return gather(rt, procs, Stack, config.get("stack_timeout") + 5.0, "stack dump")


def ask_trace_start(
    rt: Runtime, procs: Sequence[ProcId], arrived: list[int] | None = None
) -> concurrent.futures.Future[list[tuple[bool, Any]]]:
    return gather(rt, procs, TraceStart, config.get("stats_timeout"), "trace start", arrived)


def ask_trace_stop(
    rt: Runtime, procs: Sequence[ProcId]
) -> concurrent.futures.Future[list[tuple[bool, Any]]]:
    return gather(rt, procs, TraceStop, config.get("stats_timeout") * 5, "trace stop")


# -- what mesh.stats() returns ------------------------------------------------------------


@dataclass(frozen=True)
class EndpointMetrics:
    """Calls, errors and latency percentiles of an endpoint (over the actors asked).

    Latencies are the endpoint's execution time in the actor, in seconds,
    estimated from a fixed-bucket histogram (within about 9 %); None when
    there were no calls.
    """

    calls: int
    errors: int
    mean_s: float | None
    p50_s: float | None
    p90_s: float | None
    p99_s: float | None
    max_s: float
    buckets: dict[int, int] = field(repr=False)

    @classmethod
    def merge(cls, snaps: Sequence[dict[str, Any]]) -> EndpointMetrics:
        buckets: dict[int, int] = {}
        for s in snaps:
            for i, c in s["buckets"].items():
                buckets[int(i)] = buckets.get(int(i), 0) + c
        calls = sum(s["calls"] for s in snaps)
        total = sum(s["total_s"] for s in snaps)
        top = max((s["max_s"] for s in snaps), default=0.0)

        def pct(q: float) -> float | None:
            p = percentile(buckets, q)
            return min(p, top) if p is not None else None  # never above the slowest call

        return cls(
            calls=calls,
            errors=sum(s["errors"] for s in snaps),
            mean_s=total / calls if calls else None,
            p50_s=pct(50),
            p90_s=pct(90),
            p99_s=pct(99),
            max_s=top,
            buckets=buckets,
        )

    def histogram(self) -> list[tuple[float, int]]:
        """``(upper bound in seconds, count)`` for each non-empty bucket, in order."""
        return [
            (BOUNDS[i] if i < len(BOUNDS) else float("inf"), c)
            for i, c in sorted(self.buckets.items())
        ]


@dataclass(frozen=True)
class ConnectionStats:
    """Traffic on one connection of a proc (``direction``: "out" to ``peer``, or "in")."""

    peer: str
    direction: str
    tcp: bool
    frames_sent: int
    bytes_sent: int
    frames_recv: int
    bytes_recv: int


@dataclass(frozen=True)
class ProcStats:
    """One proc's answer: its identity, its connections, the raw snapshot (or why none)."""

    proc: str
    pid: int | None
    host: str | None
    connections: tuple[ConnectionStats, ...]
    snapshot: dict[str, Any] | None
    error: str | None = None


@dataclass(frozen=True)
class MeshStats:
    """What ``mesh.stats()`` returns.

    ``endpoints`` merges every actor asked, keyed ``"mesh.method"`` for a proc
    mesh and ``"method"`` for an actor mesh; ``actors`` has the same per actor
    (``"mesh[rank]"``); ``procs`` has each proc's connections, or the reason it
    did not answer.
    """

    endpoints: dict[str, EndpointMetrics]
    actors: dict[str, dict[str, EndpointMetrics]]
    procs: tuple[ProcStats, ...]


def mesh_stats(
    rt: Runtime,
    procs: Sequence[ProcId],
    mesh_id: str | None = None,
    ranks: Sequence[int] | None = None,
) -> concurrent.futures.Future[MeshStats]:
    """Ask ``procs`` for their statistics; only actor mesh ``mesh_id`` (``ranks``) if given."""
    unique = list(dict.fromkeys(procs))
    out: concurrent.futures.Future[MeshStats] = concurrent.futures.Future()
    wanted = set(ranks) if ranks is not None else None

    def done(f: concurrent.futures.Future[list[tuple[bool, Any]]]) -> None:
        try:
            out.set_result(_build(unique, f.result(), mesh_id, wanted))
        except BaseException as e:  # never leave the caller waiting
            out.set_exception(e)

    ask_stats(rt, unique).add_done_callback(done)
    return out


def _build(
    procs: list[ProcId],
    answers: list[tuple[bool, Any]],
    mesh_id: str | None,
    ranks: set[int] | None,
) -> MeshStats:
    per_key: dict[str, list[dict[str, Any]]] = {}
    actors: dict[str, dict[str, EndpointMetrics]] = {}
    pstats = []
    for proc, (ok, snap) in zip(procs, answers, strict=True):
        if not ok:
            pstats.append(ProcStats(proc.name, None, None, (), None, snap))
            continue
        conns = tuple(ConnectionStats(**c) for c in snap["connections"])
        pstats.append(ProcStats(proc.name, snap["pid"], snap["host"], conns, snap))
        for a in snap["actors"]:
            if mesh_id is not None and a["mesh_id"] != mesh_id:
                continue
            if ranks is not None and a["rank"] not in ranks:
                continue
            label = f"{a['name']}[{a['rank']}]"
            actors[label] = {m: EndpointMetrics.merge([s]) for m, s in a["endpoints"].items()}
            for m, s in a["endpoints"].items():
                key = m if mesh_id is not None else f"{a['name']}.{m}"
                per_key.setdefault(key, []).append(s)
    endpoints = {k: EndpointMetrics.merge(v) for k, v in sorted(per_key.items())}
    return MeshStats(endpoints, actors, tuple(pstats))
