"""The state the dashboard and ``danaus top`` show: hosts, procs, actors, rates, failures.

`StateCollector` asks every proc this client spawned for its
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
from collections.abc import Callable
from typing import Any

from .._actor.api import stats
from .._actor.api.procs import ProcMesh, spawned_meshes
from .._actor.api.stats import EndpointMetrics
from .._actor.core import owned
from .._runtime.messaging.metrics import percentile
from .._runtime.node import Node
from .._supervision.supervised import Supervised
from .._wire.ids import ProcId
from . import logtail

__all__ = ["StateCollector", "discover", "find_procs"]

FAILURE_LOG_LINES = 20  # log lines attached to each failure


class StateCollector:
    """Collects the dashboard's document; keeps what it needs to compute rates."""

    def __init__(self, node: Node) -> None:
        self._node = node  # the client's, whose procs it asks
        self._lock = threading.Lock()  # guards the rates' last samples (_prev, _prev_t) and _known
        self._prev: dict[tuple[str, ...], int] = {}
        self._prev_t: float | None = None
        self._known: dict[str, dict[str, Any]] = {}  # proc -> last snapshot (for dead procs)
        # (mesh_id, endpoint) -> (calls, merged latency buckets) at the previous collection
        self._prev_mesh: dict[tuple[str, str], tuple[int, dict[int, int]]] = {}

    def collect(self) -> dict[str, Any]:
        """One fresh document (blocks up to ``stats_timeout`` for slow procs)."""
        with self._lock:
            return self._collect()

    def _collect(self) -> dict[str, Any]:
        node = self._node
        rt = node.runtime
        entries = discover(node, self._known)
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
        seen: list[tuple[str, dict[str, Any], dict[str, Any]]] = []  # (proc, actor doc, raw eps)
        totals = {"procs": 0, "alive": 0, "actors": 0, "calls": 0, "errors": 0, "rate": 0.0}
        for e in entries:
            p: ProcId = e["id"]
            lost = e["lost"]
            ok, snap = e["answer"]
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
                "parent": e["parent"],
                "spawner": e["spawner"],
                "state": state,
                "reason": reason,
                "pid": snap["pid"] if snap else None,
                "host": snap["host"] if snap else _host_of(p),
                "hostname": snap["hostname"] if snap else None,
                "actors": [],
                "connections": snap["connections"] if snap else [],
                "rdma": (snap["sections"].get("rdma", []) if snap else []),
                "logs": logtail.tail(node, p.name, 50),
            }
            totals["procs"] += 1
            totals["alive"] += state == "alive"
            for a in snap["actors"] if snap else []:
                doc = self._actor(p.name, a, state, rate, totals)
                proc_doc["actors"].append(doc)
                seen.append((p.name, doc, a["endpoints"]))
            key = proc_doc["host"] or "?"
            h = hosts.setdefault(key, {"host": key, "hostname": proc_doc["hostname"], "procs": []})
            h["hostname"] = h["hostname"] or proc_doc["hostname"]
            h["procs"].append(proc_doc)
        self._prev, self._prev_t = counters, now
        meshes = self._meshes(seen, dt)
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
            "meshes": meshes,
            "failures": _failures(node),
            "restarts": _restarts(node),
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

    def _meshes(
        self, seen: list[tuple[str, dict[str, Any], dict[str, Any]]], dt: float | None
    ) -> list[dict[str, Any]]:
        """Each actor mesh seen on the procs: its ranks' states (for the page's picture) and,
        per endpoint, the calls, rate and latency percentiles of the last interval alone
        (for its plots over time)."""
        restarting = _restarting(self._node)
        members: dict[str, list[tuple[str, dict[str, Any], dict[str, Any]]]] = {}
        for proc, a, raw in seen:
            members.setdefault(a["mesh_id"], []).append((proc, a, raw))
        prev, self._prev_mesh = self._prev_mesh, {}
        out = []
        for mesh_id, ms in members.items():
            ranks: dict[int, dict[str, Any]] = {}
            for proc, a, _ in ms:
                state = "restarting" if a["rank"] in restarting.get(mesh_id, ()) else a["state"]
                old = ranks.get(a["rank"])
                # A rank restarted on another proc also shows on the dead one: the live one wins.
                if old is None or (old["state"] == "dead" and state != "dead"):
                    ranks[a["rank"]] = {"rank": a["rank"], "proc": proc, "state": state}
            eps: dict[str, dict[str, Any]] = {}
            for m in sorted({m for _, _, raw in ms for m in raw}):
                calls, buckets = 0, dict[int, int]()
                for _, _, raw in ms:
                    snap = raw.get(m)
                    if snap is None:
                        continue
                    calls += snap["calls"]
                    for i, c in snap["buckets"].items():
                        buckets[int(i)] = buckets.get(int(i), 0) + c
                self._prev_mesh[(mesh_id, m)] = (calls, buckets)
                before = prev.get((mesh_id, m))
                eps[m] = {"calls": calls, "interval_calls": None, "rate": None}
                eps[m].update(p50_s=None, p99_s=None)
                if before is not None and dt is not None and dt > 0:
                    # Only the last interval's calls: a plot over time shows change, not history.
                    window = {i: c - before[1].get(i, 0) for i, c in buckets.items()}
                    window = {i: c for i, c in window.items() if c > 0}  # a rank restarted
                    n = max(0, calls - before[0])
                    eps[m].update(interval_calls=n, rate=n / dt)
                    eps[m].update(p50_s=percentile(window, 50), p99_s=percentile(window, 99))
            first = ms[0][1]
            states = [r["state"] for r in ranks.values()]
            out.append(
                {
                    "mesh_id": mesh_id,
                    "name": first["name"],
                    "class": first["class"],
                    "state": _mesh_state(states),
                    "ranks": [ranks[r] for r in sorted(ranks)],
                    "endpoints": eps,
                }
            )
        return out


def _mesh_state(states: list[str]) -> str:
    """One word for a mesh from its ranks' states: the most alarming wins."""
    if any(s == "restarting" for s in states):
        return "restarting"
    if any(s in ("failed", "dead") for s in states):
        return "failed"
    if states and all(s in ("stopped", "stopping") for s in states):
        return "stopped"
    if any(s in ("starting", "not answering") for s in states):
        return "starting"
    return "alive"


def _restarting(node: Node) -> dict[str, set[int]]:
    """mesh_id -> the ranks a supervisor of this client is restarting now."""
    reg = node.part(Supervised)
    with reg.lock:
        sups = list(reg.supervisors)
    out: dict[str, set[int]] = {}
    for sup in sups:
        for m in sup.mesh_children():
            with m.lock:
                blocked = set(m.blocked)
            if blocked:
                out.setdefault(m.ref.mesh_id, set()).update(blocked)
    return out


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


def _proc_entries(node: Node) -> list[dict[str, Any]]:
    """Every proc this client spawned and has not stopped, with its mesh and coordinates."""
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for n, pm in enumerate(spawned_meshes(node)):
        ext = pm._shape.extent
        labels, sizes = list(ext.labels), list(ext.sizes)
        for i, p in enumerate(pm._procs):
            if p.name in seen:
                continue
            seen.add(p.name)
            out.append(
                {
                    "id": p,
                    "mesh": n,
                    "proc_mesh": pm._state.log_label,  # its name (as spawned), if any
                    "coords": _coords(i, labels, sizes),
                    "parent": None,
                    "spawner": None,
                    "lost": None,
                }
            )
    return out


def discover(
    node: Node,
    known: dict[str, dict[str, Any]] | None = None,
    check: Callable[[], None] | None = None,
) -> list[dict[str, Any]]:
    """Every proc of this client's tree, with its statistics: its own procs, then
    (level by level) the procs that their actors spawned.

    Each entry: ``id`` (ProcId), ``mesh`` (an index for the client's own proc
    meshes, ``"PARENT/INDEX"`` for a mesh that proc PARENT spawned),
    ``coords``, ``parent`` and ``spawner`` (None at the top), ``lost`` (why
    the client or the parent lost it, else None) and ``answer``: ``(True,
    snapshot)`` or ``(False, why)``. One ``STATS`` round per level, each
    bounded by ``stats_timeout``. A proc that does not answer this time is
    searched for children in ``known`` (its last snapshot), if given.
    """
    rt = node.runtime
    level = _proc_entries(node)
    seen = {e["id"].name for e in level}
    out: list[dict[str, Any]] = []
    while level:
        for e in level:
            # The parent's word first: its host agent says how the process ended.
            e["lost"] = e["lost"] or rt.peers.is_lost(e["id"].name)
        alive = [e for e in level if e["lost"] is None]
        if check is not None:  # a background thread stopping between rounds: raises
            check()
        answers = stats.ask_stats(rt, [e["id"] for e in alive]).result()
        for e in level:
            e["answer"] = (False, e["lost"])
        for e, answer in zip(alive, answers, strict=True):
            e["answer"] = answer
        out.extend(level)
        nxt: list[dict[str, Any]] = []
        for e in level:
            ok, snap = e["answer"]
            if not ok:
                snap = (known or {}).get(e["id"].name)
            for child in _children_of(e, snap):
                if child["id"].name not in seen:
                    seen.add(child["id"].name)
                    nxt.append(child)
        level = nxt
    return out


def _children_of(parent: dict[str, Any], snap: dict[str, Any] | None) -> list[dict[str, Any]]:
    if not snap:
        return []
    meshes = snap.get("sections", {}).get("children", [])
    if not isinstance(meshes, list):  # the section failed in that proc: {"error": ...}
        return []
    name = parent["id"].name
    out = []
    for m in meshes:
        for i, c in enumerate(m["procs"]):
            out.append(
                {
                    "id": ProcId(c["proc"], c["addr"]),
                    "mesh": f"{name}/{m['index']}",
                    "proc_mesh": m.get("name"),
                    "coords": _coords(i, m["labels"], m["sizes"]),
                    "parent": name,
                    "spawner": m["spawner"],
                    # The parent owns it and hears of its exit; a dead parent's procs are gone.
                    "lost": c["lost"]
                    or (
                        f"its parent proc {name} is gone, and its procs end with it"
                        if parent["lost"]
                        else None
                    ),
                }
            )
    return out


def _restarts(node: Node) -> list[dict[str, Any]]:
    """Every restart the supervisors of this client made (``danaus.supervisor``), newest
    first."""
    reg = node.part(Supervised)
    with reg.lock:
        sups = list(reg.supervisors)
    out = [r for sup in sups for r in sup.describe()["restarts"]]
    return sorted(out, key=lambda r: r["time"], reverse=True)


def _failures(node: Node) -> list[dict[str, Any]]:
    """Every failed actor of the meshes this client owns, newest mesh first."""
    out = []
    for om in owned.actor_meshes(node):
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
                    "logs": logtail.tail(node, proc, FAILURE_LOG_LINES) if proc else [],
                }
            )
    return out


def find_procs(node: Node, mesh: str, coords: dict[str, int] | list[int] | None) -> list[ProcId]:
    """The procs of mesh ``mesh`` (an actor mesh's name, a proc mesh's index, or
    ``PROC/INDEX`` for a proc mesh that proc PROC spawned) at ``coords``.

    ``coords`` is ``{"gpus": 1}`` (unnamed dimensions: all) or positional
    ``[0, 1]``; None means every proc of the mesh. Raises ``ValueError`` naming
    the meshes there are when nothing matches.
    """
    candidates: list[tuple[list[str], list[int], list[ProcId | None]]] = []
    for om in owned.actor_meshes(node):
        if om.ref.name == mesh and not om.state.stopped:
            ext = om.mesh._shape.extent
            candidates.append((list(ext.labels), list(ext.sizes), list(om.ref.procs)))
    pms: list[ProcMesh] = spawned_meshes(node)
    if not candidates and mesh.isdigit() and int(mesh) < len(pms):
        pm = pms[int(mesh)]
        ext = pm._shape.extent
        candidates.append((list(ext.labels), list(ext.sizes), list(pm._procs)))
    if not candidates:
        candidates = _nested_candidates(node, mesh)
    if not candidates:
        names = sorted({om.ref.name for om in owned.actor_meshes(node) if not om.state.stopped})
        raise ValueError(
            f"no mesh {mesh!r} in this client; actor meshes: {names}, proc meshes: "
            f"0..{len(pms) - 1} (by index), or PROC/INDEX for a proc mesh that proc PROC "
            "spawned (as `danaus top` shows it)"
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
            if p is not None and all(c[k] == v for k, v in want.items()) and p not in out:
                out.append(p)
    if not out:
        raise ValueError(f"mesh {mesh!r} has no proc at {coords}")
    return out


def _nested_candidates(
    node: Node, mesh: str
) -> list[tuple[list[str], list[int], list[ProcId | None]]]:
    """Meshes an actor spawned: a proc mesh by ``PARENT/INDEX``, or an actor mesh by name."""
    meshes: dict[str, list[dict[str, Any]]] = {}
    by_actor: dict[str, list[tuple[dict[str, Any], dict[str, Any]]]] = {}
    for e in discover(node):
        if e["parent"] is None:
            continue
        meshes.setdefault(e["mesh"], []).append(e)
        ok, snap = e["answer"]
        for a in snap["actors"] if ok else []:
            by_actor.setdefault(a["mesh_id"], []).append((a, e))
    out: list[tuple[list[str], list[int], list[ProcId | None]]] = []
    if mesh in meshes:
        out.append(_as_candidate([(e["coords"], e["id"]) for e in meshes[mesh]]))
    for members in by_actor.values():
        if members[0][0]["name"] == mesh:
            out.append(_as_candidate([(a["coords"], e["id"]) for a, e in members]))
    return out


def _as_candidate(
    members: list[tuple[dict[str, int], ProcId]],
) -> tuple[list[str], list[int], list[ProcId | None]]:
    """Dimensions and row-major procs of a mesh known only by each member's coordinates."""
    labels = list(members[0][0])
    sizes = [max(c[k] for c, _ in members) + 1 for k in labels]
    procs: list[ProcId | None] = [None] * math.prod(sizes)
    for c, p in members:
        index = 0
        for k, size in zip(labels, sizes, strict=True):
            index = index * size + c[k]
        procs[index] = p
    return labels, sizes, procs  # None where no member is (find_procs skips those)
