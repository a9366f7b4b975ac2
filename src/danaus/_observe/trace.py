"""``danaus.trace(path)``: record spans in every proc, write one Chrome/Perfetto trace.

::

    with danaus.trace("step.json"):
        trainer.step.call().get()

While the block runs, the client and every proc of its tree (the procs it
spawned, those its actors spawned, and those spawned inside the block too)
record spans: the client's calls (from sending to the
last reply), each send, each delivery to a mailbox, each endpoint's execution
and each reply, with arrows from a send to the execution it caused and from a
reply to where it arrived. At the end the spans are collected, put on the
client's clock (procs on the same host share it; another host's offset is
measured when the trace starts, to within half a round trip) and written as
Chrome trace JSON, which ``ui.perfetto.dev`` and ``chrome://tracing`` open.
``otel=True`` also hands every span to OpenTelemetry's global tracer provider
(needs ``danaus[telemetry]``), as children of the span current when the block
ends, if any. Spans the program opens with ``danaus.actor.span``/``traced``
(in the client or in actors) are recorded in the trace too, category ``span``.

This is the recording of one block in full detail (every send, delivery,
execution and reply), written when it ends; live telemetry, where endpoints of
calls made inside spans run in child spans exported as they end, is
``danaus._actor.core.telemetry`` (``JobTrait.enable_telemetry``, the setting
``telemetry``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import time
from typing import Any

from .. import _config as config
from .._actor.api import stats
from .._actor.core import telemetry
from .._actor.tools import introspect
from .._runtime.messaging.metrics import Tracer
from .._runtime.node import Node, this_node
from .._wire.ids import ProcId
from .state import discover

__all__ = ["Trace", "trace"]

log = logging.getLogger("danaus.trace")


class Trace:
    """A running trace (``with danaus.trace(path) as t:``); ``t.summary`` after the block."""

    def __init__(self, path: str | os.PathLike[str], *, otel: bool = False) -> None:
        self.path = os.fspath(path)
        self.otel = otel
        if otel:
            _otel_tracer()  # fail now, before anything runs, if the SDK is missing
        self.summary: dict[str, Any] = {}
        self._offsets: dict[str, int] = {}  # proc name -> its clock minus ours (ns)
        self._no_offset: dict[str, str] = {}  # proc name -> why its offset is unknown
        self._procs: list[ProcId] = []
        self._node: Node | None = None  # the client's, from the block's start
        self._t0 = 0
        self._wall0 = 0

    def __enter__(self) -> Trace:
        node = self._node = this_node()  # the public face: ``with danaus.trace(...)``
        rt = node.runtime
        if rt.tracer is not None:
            raise RuntimeError(
                "a trace is already running in this client; traces do not nest (end the "
                "first `with danaus.trace(...)` block before starting another)"
            )
        self._procs = _live_procs(node)
        self._wall0, self._t0 = time.time_ns(), time.perf_counter_ns()
        rt.set_tracer(Tracer(config.get("trace_max_events")))
        arrived = [0] * len(self._procs)
        sent = time.perf_counter_ns()
        answers = stats.ask_trace_start(rt, self._procs, arrived).result()
        self._learn_offsets(self._procs, sent, arrived, answers)
        return self

    def _learn_offsets(
        self, procs: list[ProcId], sent: int, arrived: list[int], answers: list[Any]
    ) -> None:
        assert self._node is not None
        me = self._node.runtime.host
        for p, t1, (ok, ans) in zip(procs, arrived, answers, strict=True):
            if not ok:
                self._no_offset[p.name] = str(ans)
                continue
            self._no_offset.pop(p.name, None)
            if ans["host"] == me:  # one kernel, one CLOCK_MONOTONIC
                self._offsets[p.name] = 0
            else:  # the proc read its clock about halfway through the round trip
                self._offsets[p.name] = ans["now_ns"] - (sent + t1) // 2

    def __exit__(self, *exc: object) -> None:  # the block's exception propagates
        node = self._node
        assert node is not None, "a trace's block ended before it began"
        rt = node.runtime
        tracer = rt.tracer
        late = tracer.late if tracer is not None else []
        for procs, sent, arrived, fut in late:
            try:
                self._learn_offsets(list(procs), sent, arrived, fut.result())
            except Exception as e:  # their spans are still collected, on a guessed clock
                log.debug("the clock offsets of %d procs were lost", len(procs), exc_info=True)
                for p in procs:
                    self._no_offset.setdefault(p.name, f"{type(e).__name__}: {e}")
        mine = introspect.stop_local_trace(rt)
        procs = list(dict.fromkeys([*self._procs, *(p for lp in late for p in lp[0])]))
        # Procs that actors spawned during the block (they joined the trace from their
        # start, as their parent was tracing): learn their clocks now, then stop them too.
        # TRACE_START is idempotent: a proc already tracing just answers with its clock.
        started = {p.name for p in procs}
        new = [p for p in _live_procs(node) if p.name not in started]
        if new:
            arrived = [0] * len(new)
            sent = time.perf_counter_ns()
            self._learn_offsets(
                new, sent, arrived, stats.ask_trace_start(rt, new, arrived).result()
            )
            procs += new
        answers = stats.ask_trace_stop(rt, procs).result()
        parts = [(mine, 0)]
        missing = []
        for p, (ok, data) in zip(procs, answers, strict=True):
            if ok:
                if p.name not in self._offsets:
                    log.warning(
                        "trace %s: the clock offset of proc %s was lost (%s); its spans are "
                        "placed as if its clock were the client's, and may be misaligned",
                        self.path,
                        p.name,
                        self._no_offset.get(p.name, "it never answered"),
                    )
                parts.append((data, self._offsets.get(p.name, 0)))
            else:
                missing.append(f"{p.name}: {data}")
        doc = chrome_trace(parts, self._t0, self._wall0)
        doc["otherData"]["procs_missing"] = missing
        _write_new(self.path, json.dumps(doc).encode())
        self.summary = {
            "path": self.path,
            "procs": len(parts),
            "events": len(doc["traceEvents"]),
            "dropped": doc["otherData"]["dropped"],
            "procs_missing": missing,
        }
        if self.otel:
            export_otel(parts, self._t0, self._wall0)


def trace(path: str | os.PathLike[str], *, otel: bool = False) -> Trace:
    """Record a trace of everything the client and its procs do inside the block.

    Writes Chrome trace JSON to ``path`` when the block ends (open it in
    ``ui.perfetto.dev``). ``otel=True`` also exports the spans to
    OpenTelemetry's global tracer provider; it raises ``ImportError`` at once
    when OpenTelemetry is not installed (``pip install 'danaus[telemetry]'``).
    Entering blocks for one round trip to every proc; leaving, for the
    collection. Raises ``RuntimeError`` if a trace is already running.
    """
    return Trace(path, otel=otel)


def _write_new(path: str, data: bytes) -> None:
    """Replace ``path`` by a file holding ``data``, through a temporary file beside it that
    is created afresh (``O_EXCL | O_NOFOLLOW``, an unguessable name): a file or symbolic
    link someone planted there is never written through (issue 40, N4). The rename
    replaces a link at ``path`` itself, never what it points to."""
    tmp = os.path.join(
        os.path.dirname(path) or ".", f".{os.path.basename(path)}.{secrets.token_hex(8)}.tmp"
    )
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(tmp, flags, 0o666)  # the umask applies, as for any file the user writes
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _live_procs(node: Node) -> list[ProcId]:
    """Every live proc of the client's tree: its own and those its actors spawned."""
    return [e["id"] for e in discover(node) if e["lost"] is None]


# -- Chrome trace JSON ------------------------------------------------------------------


def chrome_trace(parts: list[tuple[dict[str, Any], int]], t0: int, wall0: int) -> dict[str, Any]:
    """Chrome trace JSON from each proc's spans and its clock offset from the client's.

    Timestamps are microseconds since the trace started; each proc is a
    Perfetto process (client first), each thread a track.
    """
    events: list[dict[str, Any]] = []
    flows_out: dict[str, tuple[int, int, float]] = {}
    flows_in: dict[str, tuple[int, int, float]] = {}
    opened: dict[tuple[int, str], dict[str, Any]] = {}
    dropped = 0
    for pid, (data, offset) in enumerate(parts, start=1):
        dropped += data.get("dropped", 0)
        label = (
            f"client {data['proc']}"
            if data.get("client")
            else f"proc {data['proc']} ({data.get('name') or 'anon'}) pid {data['pid']}"
        )
        events.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": label}})
        events.append(
            {"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": pid}}
        )
        for tid, tname in data.get("threads", {}).items():
            events.append(
                {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": tname}}
            )

        def us(t: int, offset: int = offset) -> float:
            return (t - offset - t0) / 1000.0

        for ev in data["events"]:
            if ev[0] == "X":
                _, name, cat, start, dur, tid, args, flow_in, flow_out = ev
                ts = us(start)
                events.append(
                    {
                        "ph": "X",
                        "name": name,
                        "cat": cat,
                        "ts": ts,
                        "dur": dur / 1000.0,
                        "pid": pid,
                        "tid": tid,
                        "args": args or {},
                    }
                )
                if flow_in is not None:
                    flows_in[flow_in] = (pid, tid, ts)
                if flow_out is not None:
                    for key in (flow_out,) if isinstance(flow_out, str) else flow_out:
                        flows_out[key] = (pid, tid, ts)
            else:  # an async span's begin or end: paired here, unmatched ends dropped
                ph, name, cat, t, async_id, tid, args = ev
                key = (pid, async_id)
                if ph == "b":
                    opened[key] = {
                        "ph": "b",
                        "name": name,
                        "cat": cat,
                        "id": async_id,
                        "ts": us(t),
                        "pid": pid,
                        "tid": tid,
                        "args": args or {},
                    }
                elif key in opened:
                    begin = opened.pop(key)
                    events.append(begin)
                    events.append({**begin, "ph": "e", "ts": us(t), "args": {}})
    for n, key in enumerate(sorted(flows_out.keys() & flows_in.keys()), start=1):
        (spid, stid, sts), (fpid, ftid, fts) = flows_out[key], flows_in[key]
        cat = "reply" if key.startswith("r:") else "call"
        events.append(
            {"ph": "s", "id": n, "name": cat, "cat": cat, "pid": spid, "tid": stid, "ts": sts}
        )
        events.append(
            {
                "ph": "f",
                "bp": "e",
                "id": n,
                "name": cat,
                "cat": cat,
                "pid": fpid,
                "tid": ftid,
                "ts": fts,
            }
        )
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "generator": "danaus",
            "started_unix_ns": wall0,
            "procs": len(parts),
            "dropped": dropped,
        },
    }


# -- OpenTelemetry ------------------------------------------------------------------------


def _otel_tracer() -> Any:
    try:
        from opentelemetry import trace as ot
        from opentelemetry.sdk.trace import TracerProvider  # noqa: F401  (the SDK is there)
    except ImportError as e:
        raise ImportError(
            "danaus.trace(..., otel=True) needs OpenTelemetry's API and SDK: "
            f"{telemetry.EXTRA} (and set a TracerProvider with an exporter, or turn "
            f"telemetry on: JobTrait.enable_telemetry, the setting `telemetry`) ({e})"
        ) from e
    return ot.get_tracer("danaus")


def export_otel(parts: list[tuple[dict[str, Any], int]], t0: int, wall0: int) -> int:
    """Hand every span to OpenTelemetry's global tracer provider; returns how many."""
    tracer = _otel_tracer()
    n = 0
    for data, offset in parts:

        def unix(t: int, offset: int = offset) -> int:
            return wall0 + (t - offset - t0)

        attrs = {"danaus.proc": data["proc"], "process.pid": data["pid"]}
        opened: dict[str, tuple[str, int]] = {}
        for ev in data["events"]:
            if ev[0] == "X":
                _, name, cat, start, dur, _tid, args, _fi, _fo = ev
                span = tracer.start_span(
                    name, start_time=unix(start), attributes={**attrs, **_attrs(args), "cat": cat}
                )
                span.end(end_time=unix(start + dur))
                n += 1
            elif ev[0] == "b":
                opened[ev[4]] = (ev[1], ev[3])
            elif ev[4] in opened:
                name, start = opened.pop(ev[4])
                span = tracer.start_span(name, start_time=unix(start), attributes=attrs)
                span.end(end_time=unix(ev[3]))
                n += 1
    return n


def _attrs(args: dict[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in (args or {}).items():
        out[k] = v if isinstance(v, (str, bool, int, float)) else str(v)
    return out
