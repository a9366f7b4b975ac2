"""The state the dashboard and ``danaus top`` show: hosts, procs, actors, rates, failures.

:class:`StateCollector` asks every proc this client spawned for its
statistics (one ``STATS`` frame each, answered by the proc's I/O thread,
bounded by the ``stats_timeout`` setting) and turns the answers into one
JSON-able document (its schema is in ``docs/observing.md``). Rates are the
difference from the previous collection over the time between the two. A proc
the client has lost is shown dead at once, with the reason, from the client's
own bookkeeping: no question is sent to it.
"""

from __future__ import annotations

import math
import os
import socket
import threading
import time
from typing import Any

from .._actor import introspect, owned
from .._actor.introspect import EndpointMetrics
from .._actor.procs import ProcMesh, owned_proc_meshes
from .._runtime import host
from .._wire.ids import ProcId
from . import logtail

__all__ = ["StateCollector", "find_procs"]

FAILURE_LOG_LINES = 20  # log lines attached to each failure


class StateCollector:
    """Collects the dashboard's document; keeps what it needs to compute rates."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._prev: dict[tuple[str, ...], int] = {}
        self._prev_t: float | None = None
        self._known: dict[str, dict[str, Any]] = {}  # proc -> last snapshot (for dead procs)

    def collect(self) -> dict[str, Any]:
        """One fresh document (blocks up to ``stats_timeout`` for slow procs)."""
        with self._lock:
            return self._collect()

    def _collect(self) -> dict[str, Any]:
        rt = host.ensure_runtime()
        entries = _proc_entries()
        alive = [e["id"] for e in entries if rt.is_lost(e["id"].name) is None]
        answers = introspect.ask_stats(alive).result()
        by_name = {p.name: a for p, a in zip(alive, answers, strict=True)}
        now = time.time()
        dt = now - self._prev_t if self._prev_t is not None else None
        counters: dict[tuple[str, ...], int] = {}

        def rate(key: tuple[str, ...], value: int) -> float | None:
            counters[key] = value
            old = self._prev.get(key)
            if dt is None or dt <= 0 or old is None:
                return None
            return max(0.0, (value - old) / dt)

        hosts: dict[str, dict[str, Any]] = {}
        totals = {"procs": 0, "alive": 0, "actors": 0, "calls": 0, "errors": 0, "rate": 0.0}
        for e in entries:
            p: ProcId = e["id"]
            lost = rt.is_lost(p.name)
            ok, snap = by_name.get(p.name, (False, None))
            if lost is not None:
                state, reason, snap = "dead", lost, self._known.get(p.name)
            elif ok:
                state, reason = "alive", None
                self._known[p.name] = snap
            else:
                state, reason, snap = "not answering", snap, self._known.get(p.name)
            proc_doc = {
                "proc": p.name,
                "mesh": e["mesh"],
                "coords": e["coords"],
                "state": state,
                "reason": reason,
                "pid": snap["pid"] if snap else None,
                "host": snap["host"] if snap else _host_of(p),
                "hostname": snap["hostname"] if snap else None,
                "actors": [],
                "connections": snap["connections"] if snap else [],
                "rdma": (snap["sections"].get("rdma", []) if snap else []),
                "logs": logtail.tail(p.name, 50),
            }
            totals["procs"] += 1
            totals["alive"] += state == "alive"
            for a in snap["actors"] if snap else []:
                proc_doc["actors"].append(self._actor(p.name, a, state, rate, totals))
            key = proc_doc["host"] or "?"
            h = hosts.setdefault(key, {"host": key, "hostname": proc_doc["hostname"], "procs": []})
            h["hostname"] = h["hostname"] or proc_doc["hostname"]
            h["procs"].append(proc_doc)
        self._prev, self._prev_t = counters, now
        return {
            "time": now,
            "interval_s": dt,
            "client": {
                "proc": rt.proc_id.name,
                "pid": os.getpid(),
                "host": rt.host,
                "hostname": socket.gethostname(),
            },
            "totals": totals,
            "hosts": list(hosts.values()),
            "failures": _failures(),
        }

    def _actor(
        self, proc: str, a: dict[str, Any], proc_state: str, rate: Any, totals: dict[str, Any]
    ) -> dict[str, Any]:
        label = f"{a['name']}[{a['rank']}]"
        eps = {}
        for m, snap in sorted(a["endpoints"].items()):
            em = EndpointMetrics.merge([snap])
            r = rate((proc, a["mesh_id"], str(a["rank"]), m), em.calls)
            eps[m] = {
                "calls": em.calls,
                "errors": em.errors,
                "rate": r,
                "mean_s": em.mean_s,
                "p50_s": em.p50_s,
                "p90_s": em.p90_s,
                "p99_s": em.p99_s,
                "max_s": em.max_s,
                "histogram": [[_finite(b), c] for b, c in em.histogram()],
            }
            totals["calls"] += em.calls
            totals["errors"] += em.errors
            totals["rate"] += r or 0.0
        totals["actors"] += 1
        state = a["state"] if proc_state == "alive" else proc_state
        return {
            "actor": label,
            "name": a["name"],
            "mesh_id": a["mesh_id"],
            "rank": a["rank"],
            "coords": a["coords"],
            "class": a["class"],
            "state": state,
            "failure": a["failure"],
            "received": a["received"],
            "rate": rate((proc, a["mesh_id"], str(a["rank"]), "*"), a["received"]),
            "queued": a["queued"],
            "endpoints": eps,
        }


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _host_of(p: ProcId) -> str | None:
    for part in p.addr.split(";"):
        if part.startswith("host:"):
            return part[5:]
    return None


def _coords(index: int, labels: list[str], sizes: list[int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for label, size in reversed(list(zip(labels, sizes, strict=True))):
        out[label] = index % size
        index //= size
    return dict(reversed(list(out.items())))


def _proc_entries() -> list[dict[str, Any]]:
    """Every proc this client spawned and has not stopped, with its mesh and coordinates."""
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for n, pm in enumerate(owned_proc_meshes()):
        ext = pm._shape.extent
        labels, sizes = list(ext.labels), list(ext.sizes)
        for i, p in enumerate(pm._procs):
            if p.name in seen:
                continue
            seen.add(p.name)
            out.append({"id": p, "mesh": n, "coords": _coords(i, labels, sizes)})
    return out


def _failures() -> list[dict[str, Any]]:
    """Every failed actor of the meshes this client owns, newest mesh first."""
    out = []
    for om in owned.actor_meshes():
        with om.state.lock:
            failed = dict(om.state.failed)
            tbs = dict(om.state.tracebacks)
        for rank, reason in sorted(failed.items()):
            proc = om.ref.procs[rank].name if rank < len(om.ref.procs) else None
            out.append(
                {
                    "actor": f"{om.ref.name}[{rank}]",
                    "mesh": om.ref.name,
                    "rank": rank,
                    "proc": proc,
                    "reason": reason,
                    "traceback": tbs.get(rank, ""),
                    "logs": logtail.tail(proc, FAILURE_LOG_LINES) if proc else [],
                }
            )
    return out


def find_procs(mesh: str, coords: dict[str, int] | list[int] | None) -> list[ProcId]:
    """The procs of mesh ``mesh`` (an actor mesh's name, or a proc mesh's index) at ``coords``.

    ``coords`` is ``{"gpus": 1}`` (unnamed dimensions: all) or positional
    ``[0, 1]``; None means every proc of the mesh. Raises ``ValueError`` naming
    the meshes there are when nothing matches.
    """
    candidates: list[tuple[list[str], list[int], list[ProcId]]] = []
    for om in owned.actor_meshes():
        if om.ref.name == mesh and not om.state.stopped:
            ext = om.mesh._shape.extent
            candidates.append((list(ext.labels), list(ext.sizes), list(om.ref.procs)))
    pms: list[ProcMesh] = owned_proc_meshes()
    if not candidates and mesh.isdigit() and int(mesh) < len(pms):
        pm = pms[int(mesh)]
        ext = pm._shape.extent
        candidates.append((list(ext.labels), list(ext.sizes), list(pm._procs)))
    if not candidates:
        names = sorted({om.ref.name for om in owned.actor_meshes() if not om.state.stopped})
        raise ValueError(
            f"no mesh {mesh!r} in this client; actor meshes: {names}, proc meshes: "
            f"0..{len(pms) - 1} (by index)"
        )
    out: list[ProcId] = []
    for labels, sizes, procs in candidates:
        if isinstance(coords, list):
            if len(coords) != len(labels):
                raise ValueError(
                    f"mesh {mesh!r} has dimensions {labels}; coordinates {coords} give "
                    f"{len(coords)} of {len(labels)}"
                )
            want = dict(zip(labels, coords, strict=True))
        else:
            want = dict(coords or {})
            unknown = set(want) - set(labels)
            if unknown:
                raise ValueError(f"mesh {mesh!r} has dimensions {labels}, not {sorted(unknown)}")
        for i, p in enumerate(procs):
            c = _coords(i, labels, sizes)
            if all(c[k] == v for k, v in want.items()) and p not in out:
                out.append(p)
    if not out:
        raise ValueError(f"mesh {mesh!r} has no proc at {coords}")
    return out
