"""Looking inside procs: statistics, traces and stack dumps, asked for by a message.

Every runtime answers four frames on its I/O thread, so a busy or blocked
actor never delays the answer::

    asker --STATS(port)-------> proc   snapshot: actors, endpoint metrics, connections
    asker --TRACE_START(port)-> proc   start recording spans; answer with this proc's clock
    asker --TRACE_STOP(port)--> proc   stop; answer with the spans recorded
    asker --STACK(port)-------> proc   py-spy dump of itself (from a helper thread), or
                                       Python's own view of its threads if py-spy cannot

The asker side (``gather``) sends one frame per proc and waits for the answers
up to a timeout; a proc that is lost or does not answer in time is reported
as such, never waited for. ``ActorMesh.stats()`` / ``ProcMesh.stats()`` build
on it (``mesh_stats``); ``danaus._observe`` serves the rest.
"""

from __future__ import annotations

import concurrent.futures
import functools
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ... import _config as config
from ..._runtime.hosting import host
from ..._runtime.messaging.metrics import BOUNDS, Tracer, percentile
from ..._runtime.messaging.runtime import STATUS_OK, Runtime
from ..._runtime.node import Node
from ..._wire.ids import ProcId
from ..._wire.protocol import Kind, Message, Stack, Stats, Telemetry, TraceStart, TraceStop
from ..core.cell import ActorCell
from ..core.collect import Collector

__all__ = [
    "ConnectionStats",
    "EndpointMetrics",
    "MeshStats",
    "ProcStats",
    "dump_stacks",
    "gather",
    "install",
    "mesh_stats",
    "recent",
    "snapshot",
]


# -- the proc side (I/O thread) -------------------------------------------------------


def install(node: Node, boot: dict[str, Any]) -> None:
    """Answer STATS, TRACE_START, TRACE_STOP and STACK in ``node``'s runtime."""
    rt = node.runtime
    rt.register(Kind.STATS, lambda conn, msg: _on_stats(rt, msg))
    rt.register(Kind.TRACE_START, lambda conn, msg: _on_trace_start(rt, msg))
    rt.register(Kind.TRACE_STOP, lambda conn, msg: _on_trace_stop(rt, msg))
    rt.register(Kind.STACK, lambda conn, msg: _on_stack(rt, msg))
    rt.register(Kind.TELEMETRY, lambda conn, msg: _on_telemetry(rt, msg))


def _state(cell: ActorCell) -> str:
    if cell.failed is not None:
        return "failed"
    if cell.stopped:
        return "stopped"
    if cell.stopping:
        return "stopping"
    if cell.instance is None:
        return "starting"
    running = cell.running
    return f"running {running}()" if running is not None else "idle"


def snapshot(rt: Runtime) -> dict[str, Any]:
    """This proc's actors, their endpoint metrics and its connections, as plain data."""
    actors = []
    for (mesh_id, rank), mb in list(rt.mailboxes.items()):
        if not isinstance(mb, ActorCell):
            continue
        inst = mb.instance
        actors.append(
            {
                "mesh_id": mesh_id,
                "name": mb.display_name,
                "rank": rank,
                "coords": dict(zip(mb.extent.labels, _coords(rank, mb.extent.sizes), strict=True)),
                "class": type(inst).__qualname__ if inst is not None else None,
                "started": mb.started,
                "state": _state(mb),
                "failure": mb.failed,
                "received": mb.received,
                "queued": len(mb._queued),
                "endpoints": {m: st.snapshot() for m, st in list(mb.stats.items())},
            }
        )
    conns = [
        {
            "peer": name,
            "direction": direction,
            "tcp": c.tcp,
            "frames_sent": c.frames_sent,
            "bytes_sent": c.bytes_sent,
            "frames_recv": c.frames_recv,
            "bytes_recv": c.bytes_recv,
        }
        for name, direction, c in rt.connections()
    ]
    sections = {}
    for name, fn in list(rt.observers.items()):
        try:
            sections[name] = fn()
        except Exception as e:  # one broken section must not hide the rest
            sections[name] = {"error": f"{type(e).__name__}: {e}"}
    return {
        "proc": rt.proc_id.name,
        "pid": os.getpid(),
        "host": rt.host,
        "hostname": socket.gethostname(),
        "client": not rt.boot,
        "name": rt.boot.get("name") if rt.boot else "client",
        "time": time.time(),
        "metrics": rt.metrics,
        "actors": actors,
        "connections": conns,
        "sections": sections,
    }


def _coords(rank: int, sizes: Sequence[int]) -> list[int]:
    out = []
    for size in reversed(list(sizes)):
        out.append(rank % size if size else 0)
        rank = rank // size if size else 0
    return out[::-1]


def _on_stats(rt: Runtime, msg: Message) -> None:
    rt.reply(msg.header.port, msg.header.slot, STATUS_OK, snapshot(rt))


def recent(rt: Runtime) -> dict[str, Any]:
    """This proc's rings (``Runtime.recent``) as plain data, with who it is; empty
    rings when metrics are off."""
    data = (
        rt.recent.copy()
        if rt.recent is not None
        else {"messages": [], "spans": [], "ended": [], "seen": 0, "size": 0}
    )
    data.setdefault("now_ns", time.perf_counter_ns())
    data.setdefault("now_s", time.time())
    data.update(proc=rt.proc_id.name, host=rt.host, pid=os.getpid())
    return data


def _on_telemetry(rt: Runtime, msg: Message) -> None:
    rt.reply(msg.header.port, msg.header.slot, STATUS_OK, recent(rt))


def _on_trace_start(rt: Runtime, msg: Message) -> None:
    if rt.tracer is None:
        rt.set_tracer(Tracer(config.get("trace_max_events")))
    clock = {"now_ns": time.perf_counter_ns(), "host": rt.host, "pid": os.getpid()}
    rt.reply(msg.header.port, msg.header.slot, STATUS_OK, clock)


def _on_trace_stop(rt: Runtime, msg: Message) -> None:
    rt.reply(msg.header.port, msg.header.slot, STATUS_OK, stop_local_trace(rt))


def stop_local_trace(rt: Runtime) -> dict[str, Any]:
    """Stop this runtime's tracer; its spans with who recorded them (empty if none ran)."""
    tracer = rt.set_tracer(None)
    data = tracer.drain() if tracer is not None else {"events": [], "threads": {}, "dropped": 0}
    data.update(
        proc=rt.proc_id.name,
        pid=os.getpid(),
        host=rt.host,
        name=rt.boot.get("name") if rt.boot else "client",
        client=not rt.boot,
    )
    return data


def _on_stack(rt: Runtime, msg: Message) -> None:
    port, slot = msg.header.port, msg.header.slot

    def run() -> None:  # py-spy takes a while: never on the I/O thread
        rt.reply(port, slot, STATUS_OK, dump_stacks())

    threading.Thread(target=run, name="danaus-stack-dump", daemon=True).start()


def _py_spy() -> str | None:
    here = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return here if os.access(here, os.X_OK) else shutil.which("py-spy")


def dump_stacks(pid: int | None = None) -> str:
    """A py-spy dump of process ``pid`` (default: this one) as text.

    If py-spy is missing or may not attach (e.g. a kernel whose Yama
    ``ptrace_scope`` forbids it) and ``pid`` is this process, Python's own view
    of this process's threads follows a line that says why. Blocks (seconds).
    """
    me = pid is None or pid == os.getpid()
    target = os.getpid() if pid is None else pid
    exe = _py_spy()
    if exe is None:
        why = "py-spy is not installed (pip install 'danaus[dashboard]')"
    else:
        try:
            r = subprocess.run(
                [exe, "dump", "--pid", str(target)],
                capture_output=True,
                text=True,
                timeout=config.get("stack_timeout"),
                stdin=subprocess.DEVNULL,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            why = f"py-spy failed: {e}"
        else:
            if r.returncode == 0:
                return r.stdout
            why = f"py-spy failed (exit code {r.returncode}): {r.stderr.strip()[-500:]}"
    if not me:
        return f"({why})"
    return f"({why}; Python's own view of the threads follows)\n\n{python_stacks()}"


def python_stacks() -> str:
    """Every thread of this process with its Python stack, innermost call last."""
    names = {t.ident: t.name for t in threading.enumerate()}
    out = []
    for ident, frame in sys._current_frames().items():
        out.append(f'Thread {ident} "{names.get(ident, "?")}"')
        out.extend(line.rstrip("\n") for line in traceback.format_stack(frame))
        out.append("")
    return "\n".join(out)


# -- the asking side ------------------------------------------------------------------


def gather(
    procs: Sequence[ProcId],
    make: Callable[[Any, int], Any],
    timeout: float,
    what: str,
    arrived: list[int] | None = None,
) -> concurrent.futures.Future[list[tuple[bool, Any]]]:
    """Send ``make(port, slot)`` to each proc; completes with ``(ok, answer or why)`` each.

    Never waits for more than ``timeout`` seconds: a proc that has not answered
    by then, or is lost, gets ``(False, "why")``. Does not block. ``arrived``
    (one slot per proc) receives each answer's ``perf_counter_ns()`` arrival.
    """
    rt = host.ensure_runtime()
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
            rt.close_port(collector.port.port)
            rt.unwatch(collector.watched, collector.port.port)
            finish()

    rt.call_soon(lambda: rt.loop.call_later(timeout, expire))
    for i, p in enumerate(procs):
        collector.expect(i, p, f"proc {p.name}")
    for i, p in enumerate(procs):
        rt.send(p, make(collector.port, i), on_fail=functools.partial(collector.fail, i))
    return cf


def ask_stats(procs: Sequence[ProcId]) -> concurrent.futures.Future[list[tuple[bool, Any]]]:
    return gather(procs, Stats, config.get("stats_timeout"), "stats")


def ask_recent(procs: Sequence[ProcId]) -> concurrent.futures.Future[list[tuple[bool, Any]]]:
    return gather(procs, Telemetry, config.get("stats_timeout"), "telemetry")


def ask_stacks(procs: Sequence[ProcId]) -> concurrent.futures.Future[list[tuple[bool, Any]]]:
    return gather(procs, Stack, config.get("stack_timeout") + 5.0, "stack dump")


def ask_trace_start(
    procs: Sequence[ProcId], arrived: list[int] | None = None
) -> concurrent.futures.Future[list[tuple[bool, Any]]]:
    return gather(procs, TraceStart, config.get("stats_timeout"), "trace start", arrived)


def ask_trace_stop(procs: Sequence[ProcId]) -> concurrent.futures.Future[list[tuple[bool, Any]]]:
    return gather(procs, TraceStop, config.get("stats_timeout") * 5, "trace stop")


# -- what mesh.stats() returns ------------------------------------------------------------


@dataclass(frozen=True)
class EndpointMetrics:
    """Calls, errors and latency percentiles of an endpoint (over the actors asked).

    Latencies are the endpoint's execution time in the actor, in seconds,
    estimated from a fixed-bucket histogram (within about 33 %); None when
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
    procs: Sequence[ProcId], mesh_id: str | None = None, ranks: Sequence[int] | None = None
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

    ask_stats(unique).add_done_callback(done)
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
