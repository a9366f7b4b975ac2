"""The telemetry tables (actors, messages, spans, metrics, gpus), gathered from a live mesh.

Nothing here measures: the rows come from what every proc already keeps. A
``STATS`` round (``state.discover``: the whole proc tree, nested procs
included, with each lost proc's reason) gives the actors, their endpoint
metrics and the connections' bytes; a ``TELEMETRY`` round asks the procs that
answered for their rings (``Runtime.recent``: sampled messages, spans, actors
that ended). The client's own proc is read in place. ``sql`` loads the rows
into DuckDB; ``prom`` turns the same ``STATS`` answers into Prometheus metrics.

Times are Unix seconds (floats): each proc's ``perf_counter_ns`` stamps are
converted with that proc's own clocks, read in the same answer, so hosts
need no common monotonic clock.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from .._actor.api import stats as api_stats
from .._actor.api.stats import EndpointMetrics
from .._actor.core import owned
from .._actor.tools import introspect
from .._runtime.node import Node
from .state import discover

__all__ = ["COLUMNS", "TABLES", "Snapshot", "collect", "gather", "gpu_of"]

#: Each table's columns: (name, DuckDB type, what it holds). docs/observing.md
#: documents the same (a test compares them).
COLUMNS: dict[str, list[tuple[str, str, str]]] = {
    "actors": [
        ("mesh", "VARCHAR", "the actor mesh's name (as spawned)"),
        ("mesh_id", "VARCHAR", "the actor mesh's unique id"),
        ("rank", "BIGINT", "the actor's rank in its mesh"),
        ("class", "VARCHAR", "the actor's class (NULL when its proc is lost)"),
        ("proc", "VARCHAR", "the proc it lives on"),
        ("host", "VARCHAR", "that proc's host"),
        (
            "state",
            "VARCHAR",
            "idle, running NAME(), starting, stopping, stopped, failed, "
            "lost (its proc is gone) or not answering",
        ),
        ("started", "DOUBLE", "when it was spawned (Unix seconds)"),
        ("stopped", "DOUBLE", "when it stopped or failed (Unix seconds), NULL while it lives"),
        ("failure", "VARCHAR", "why it failed or its proc was lost, else NULL"),
        ("received", "BIGINT", "messages delivered to it"),
        ("queued", "BIGINT", "calls in its inbox now (its queue depth)"),
    ],
    "messages": [
        ("mesh", "VARCHAR", "the receiving actor's mesh"),
        ("mesh_id", "VARCHAR", "that mesh's unique id"),
        ("rank", "BIGINT", "the receiving actor's rank"),
        ("receiver", "VARCHAR", "the receiving actor, MESH[RANK]"),
        ("proc", "VARCHAR", "the receiver's proc"),
        ("host", "VARCHAR", "that proc's host"),
        ("endpoint", "VARCHAR", "the endpoint called"),
        (
            "sender",
            "VARCHAR",
            "the calling actor (PROC/MESH_ID[RANK]), or the caller's "
            "proc when no actor sent it (the client's main thread)",
        ),
        ("request_bytes", "BIGINT", "bytes of the call (arguments, buffers included)"),
        ("reply_bytes", "BIGINT", "bytes of the reply's body (NULL: no reply, e.g. broadcast)"),
        ("arrived", "DOUBLE", "when the call reached the receiver's proc (Unix seconds)"),
        ("started", "DOUBLE", "when the endpoint began (Unix seconds)"),
        ("ended", "DOUBLE", "when the endpoint returned or raised (Unix seconds)"),
        ("queued_s", "DOUBLE", "seconds in the inbox: started - arrived"),
        ("handled_s", "DOUBLE", "seconds the endpoint ran: ended - started"),
        ("ok", "BOOLEAN", "false when the endpoint raised"),
        (
            "sample_rate",
            "DOUBLE",
            "the fraction of messages recorded when this one was: 1.0 "
            "is every message; 0.25 means each row stands for 4 (scale counts by 1/sample_rate)",
        ),
    ],
    "spans": [
        ("name", "VARCHAR", "the span's name"),
        ("actor", "VARCHAR", "the actor that recorded it (NULL outside actors)"),
        ("proc", "VARCHAR", "the proc that recorded it"),
        ("host", "VARCHAR", "that proc's host"),
        ("started", "DOUBLE", "when it began (Unix seconds)"),
        ("ended", "DOUBLE", "when it ended (Unix seconds)"),
        ("duration_s", "DOUBLE", "ended - started, in seconds"),
        ("trace_id", "VARCHAR", "its trace's id (hex), if it has one"),
        ("span_id", "VARCHAR", "its own id (hex), if it has one"),
        ("parent_id", "VARCHAR", "its parent span's id (hex), NULL for a root"),
        ("attributes", "VARCHAR", "its attributes, as a JSON object"),
    ],
    "metrics": [
        ("time", "DOUBLE", "when the proc answered (Unix seconds)"),
        ("proc", "VARCHAR", "the proc measured"),
        ("host", "VARCHAR", "that proc's host"),
        ("mesh", "VARCHAR", "the actor mesh (NULL for a proc's own metrics)"),
        ("mesh_id", "VARCHAR", "that mesh's unique id"),
        ("rank", "BIGINT", "the actor's rank (NULL for a proc's own metrics)"),
        ("endpoint", "VARCHAR", "the endpoint (NULL for an actor's or a proc's metrics)"),
        (
            "name",
            "VARCHAR",
            "the metric: calls, errors, latency_sum_s, latency_max_s, "
            "latency_p50_s, latency_p99_s (per endpoint); received, queued (per actor); "
            "bytes_sent, bytes_received, frames_sent, frames_received, messages_seen, "
            "transfers, transfer_bytes, transfer_s, transfer_errors (per proc)",
        ),
        ("value", "DOUBLE", "its value (counters since the actor or proc started)"),
    ],
    "gpus": [
        ("time", "DOUBLE", "when the proc answered (Unix seconds)"),
        ("proc", "VARCHAR", "the proc measured"),
        ("host", "VARCHAR", "that proc's host"),
        ("device", "VARCHAR", "the CUDA device, cuda:INDEX as the proc sees it"),
        ("device_name", "VARCHAR", "the GPU's model"),
        ("memory_allocated_bytes", "BIGINT", "bytes of tensors the proc holds on it now"),
        ("memory_reserved_bytes", "BIGINT", "bytes PyTorch's caching allocator holds on it now"),
        ("memory_peak_bytes", "BIGINT", "the most bytes of tensors held at once"),
        ("kernels", "BIGINT", "tensor engine ops timed there as kernels"),
        ("kernel_s", "DOUBLE", "GPU seconds of those kernels (CUDA events)"),
        ("copies", "BIGINT", "tensor engine ops timed there as copies"),
        ("copy_s", "DOUBLE", "GPU seconds of those copies (CUDA events)"),
    ],
}

TABLES = tuple(COLUMNS)

_RING_TABLES = {"messages", "spans", "actors"}  # what needs a TELEMETRY round
_GPU_NONE: dict[str, Any] = {"devices": [], "transfers": {}}  # a proc that answers no "gpu"


class Snapshot:
    """One round of questions: every proc's entry (``discover``) and rings."""

    def __init__(
        self,
        entries: list[dict[str, Any]],
        rings: dict[str, dict[str, Any]],
        node: Node | None = None,
    ) -> None:
        self.entries = entries  # discover()'s, plus the client's own proc
        self.rings = rings  # proc name -> introspect.recent()'s answer
        self.node = node  # the client's, whose bookkeeping names actors of lost procs


def gather(node: Node, rings: bool = True, check: Callable[[], None] | None = None) -> Snapshot:
    """Ask every proc of ``node``'s client's tree (and read the client's own proc).

    ``check`` is called before each round of questions (a background thread's way
    to stop between them: it raises)."""
    if check is not None:
        check()
    rt = node.runtime
    entries = discover(node, check=check)
    names = {e["id"].name for e in entries}
    if rt.proc_id.name not in names:
        entries.append(
            {
                "id": rt.proc_id,
                "mesh": None,
                "coords": {},
                "parent": None,
                "spawner": None,
                "lost": None,
                "answer": (True, introspect.snapshot(rt)),
            }
        )
    got: dict[str, dict[str, Any]] = {}
    if rings:
        if check is not None:
            check()
        remote = [e["id"] for e in entries if e["answer"][0] and e["id"] != rt.proc_id]
        for p, (ok, data) in zip(remote, api_stats.ask_recent(rt, remote).result(), strict=True):
            if ok:
                got[p.name] = data
        got[rt.proc_id.name] = introspect.recent(rt)
    return Snapshot(entries, got, node)


def collect(node: Node, tables: Iterable[str] = TABLES) -> dict[str, list[tuple[Any, ...]]]:
    """The rows of ``tables`` (each a tuple in ``COLUMNS`` order), from one round of
    ``node``'s client."""
    wanted = set(tables)
    unknown = wanted - set(TABLES)
    if unknown:
        raise ValueError(f"no telemetry table {sorted(unknown)}; there are {list(TABLES)}")
    snap = gather(node, rings=bool(wanted & _RING_TABLES))
    out: dict[str, list[tuple[Any, ...]]] = {}
    names = _mesh_names(snap)
    if "actors" in wanted:
        out["actors"] = _actors(snap)
    if "messages" in wanted:
        out["messages"] = _messages(snap, names)
    if "spans" in wanted:
        out["spans"] = _spans(snap)
    if "metrics" in wanted:
        out["metrics"] = _metrics(snap)
    if "gpus" in wanted:
        out["gpus"] = _gpus(snap)
    return out


def _mesh_names(snap: Snapshot) -> dict[str, str]:
    names: dict[str, str] = {}
    for e in snap.entries:
        ok, s = e["answer"]
        for a in s["actors"] if ok else []:
            names[a["mesh_id"]] = a["name"]
    for ring in snap.rings.values():
        for a in ring["ended"]:
            names.setdefault(a["mesh_id"], a["name"])
    return names


def _host(e: dict[str, Any]) -> str | None:
    ok, s = e["answer"]
    if ok:
        return s["host"]  # type: ignore[no-any-return]
    for part in e["id"].addr.split(";"):
        if part.startswith("host:"):
            return part[5:]  # type: ignore[no-any-return]
    return None


def _actors(snap: Snapshot) -> list[tuple[Any, ...]]:
    rows: dict[tuple[str, str, int], tuple[Any, ...]] = {}
    lost: dict[str, tuple[str, str | None]] = {}
    for e in snap.entries:
        proc, hst = e["id"].name, _host(e)
        ok, s = e["answer"]
        if not ok:
            state = "lost" if e["lost"] is not None else "not answering"
            lost[proc] = (state, str(s))
            continue
        for a in s["actors"]:
            rows[(proc, a["mesh_id"], a["rank"])] = (
                a["name"], a["mesh_id"], a["rank"], a["class"], proc, hst, a["state"],
                a.get("started"), None, a["failure"], a["received"], a["queued"],
            )  # fmt: skip
    for proc, ring in snap.rings.items():
        for a in ring["ended"]:
            key = (proc, a["mesh_id"], a["rank"])
            old = rows.get(key)
            rows[key] = (
                a["name"], a["mesh_id"], a["rank"], a["class"], proc, ring["host"], a["state"],
                a["started"], a["stopped"], a["failure"],
                old[10] if old else None, 0,
            )  # fmt: skip
    # Actors on procs that are lost or silent: the client's own bookkeeping names them.
    for om in owned.actor_meshes(snap.node) if snap.node is not None else ():
        for rank, p in enumerate(om.ref.procs):
            if p is None or p.name not in lost:
                continue
            state, why = lost[p.name]
            key = (p.name, om.ref.mesh_id, rank)
            if key not in rows:
                rows[key] = (
                    om.ref.name, om.ref.mesh_id, rank, None, p.name, _addr_host(p.addr),
                    state, None, None, why, None, None,
                )  # fmt: skip
    return list(rows.values())


def _addr_host(addr: str) -> str | None:
    for part in addr.split(";"):
        if part.startswith("host:"):
            return part[5:]
    return None


def _messages(snap: Snapshot, names: dict[str, str]) -> list[tuple[Any, ...]]:
    rows = []
    for proc, ring in snap.rings.items():
        now_ns, now_s, hst = ring["now_ns"], ring["now_s"], ring["host"]

        def wall(t: int, now_ns: int = now_ns, now_s: float = now_s) -> float:
            return float(now_s - (now_ns - t) * 1e-9)

        for arrived, started, ended, mesh_id, rank, method, sender, req, rep, ok, stride in ring[
            "messages"
        ]:
            mesh = names.get(mesh_id) or mesh_id.rsplit(".", 1)[0]
            rows.append(
                (
                    mesh,
                    mesh_id,
                    rank,
                    f"{mesh}[{rank}]",
                    proc,
                    hst,
                    method,
                    sender,
                    req,
                    rep,
                    wall(arrived),
                    wall(started),
                    wall(ended),
                    (started - arrived) * 1e-9,
                    (ended - started) * 1e-9,
                    ok,
                    1.0 / stride,
                )
            )
    return rows


def _spans(snap: Snapshot) -> list[tuple[Any, ...]]:
    rows = []
    for proc, ring in snap.rings.items():
        now_ns, now_s, hst = ring["now_ns"], ring["now_s"], ring["host"]
        for name, t0, t1, actor, trace_id, span_id, parent_id, attrs in ring["spans"]:
            if type(trace_id) is int:  # danaus's endpoint spans keep their ids as ints
                trace_id, span_id = format(trace_id, "032x"), format(span_id, "016x")
                parent_id = format(parent_id, "016x") if parent_id else None
            start = now_s - (now_ns - t0) * 1e-9
            end = now_s - (now_ns - t1) * 1e-9
            rows.append(
                (
                    name,
                    actor,
                    proc,
                    hst,
                    start,
                    end,
                    (t1 - t0) * 1e-9,
                    trace_id,
                    span_id,
                    parent_id,
                    json.dumps(attrs or {}, default=str),
                )
            )
    return rows


_ENDPOINT_METRICS: tuple[tuple[str, Callable[[EndpointMetrics], float | None]], ...] = (
    ("calls", lambda em: em.calls),
    ("errors", lambda em: em.errors),
    ("latency_sum_s", lambda em: (em.mean_s or 0.0) * em.calls),
    ("latency_max_s", lambda em: em.max_s),
    ("latency_p50_s", lambda em: em.p50_s),
    ("latency_p99_s", lambda em: em.p99_s),
)


def _metrics(snap: Snapshot) -> list[tuple[Any, ...]]:
    rows: list[tuple[Any, ...]] = []
    for e in snap.entries:
        ok, s = e["answer"]
        if not ok:
            continue
        proc, hst, t = e["id"].name, s["host"], s["time"]
        for a in s["actors"]:
            mesh, mid, rank = a["name"], a["mesh_id"], a["rank"]
            for ep, raw in sorted(a["endpoints"].items()):
                em = EndpointMetrics.merge([raw])
                for name, fn in _ENDPOINT_METRICS:
                    rows.append((t, proc, hst, mesh, mid, rank, ep, name, fn(em)))
            rows.append((t, proc, hst, mesh, mid, rank, None, "received", a["received"]))
            rows.append((t, proc, hst, mesh, mid, rank, None, "queued", a["queued"]))
        conns = s["connections"]
        for name, key in (
            ("bytes_sent", "bytes_sent"),
            ("bytes_received", "bytes_recv"),
            ("frames_sent", "frames_sent"),
            ("frames_received", "frames_recv"),
        ):
            rows.append((t, proc, hst, None, None, None, None, name, sum(c[key] for c in conns)))
        seen = s.get("messages_seen")
        if seen is not None:
            rows.append((t, proc, hst, None, None, None, None, "messages_seen", seen))
        moved = gpu_of(s)["transfers"]
        if moved:
            for name, key in (
                ("transfers", "count"),
                ("transfer_bytes", "bytes"),
                ("transfer_s", "seconds"),
                ("transfer_errors", "errors"),
            ):
                rows.append((t, proc, hst, None, None, None, None, name, moved[key]))
    return rows


def gpu_of(s: dict[str, Any]) -> dict[str, Any]:
    """A proc's ``"gpu"`` section (``danaus._actor.core.gpu.observe``): its devices and
    transfers; empty ones for a proc that did not answer one (or whose failed)."""
    g = s.get("sections", {}).get("gpu")
    if not isinstance(g, dict) or "devices" not in g:
        return _GPU_NONE
    return g


def _gpus(snap: Snapshot) -> list[tuple[Any, ...]]:
    """One row per CUDA device per proc that used one (none on a CPU-only mesh)."""
    rows: list[tuple[Any, ...]] = []
    for e in snap.entries:
        ok, s = e["answer"]
        if not ok:
            continue
        for d in gpu_of(s)["devices"]:
            rows.append(
                (
                    s["time"], e["id"].name, s["host"], d["device"], d["name"],
                    d["allocated"], d["reserved"], d["peak"],
                    d["kernels"], d["kernel_s"], d["copies"], d["copy_s"],
                )
            )  # fmt: skip
    return rows
