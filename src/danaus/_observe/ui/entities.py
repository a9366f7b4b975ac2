"""The jobs, meshes and actors pages' data: ``GET /api/ui/overview``.

One document for the three pages (they link to each other, so the page fetches it once
per refresh):

- ``job``: this client (its name is the job's: the log directory and the history file
  are named for it), its program, pid, host, where its logs and history are; ``jobs``:
  every job with a log directory on this host, newest first (a finished one's logs
  stay there for ``danaus logs --job``);
- ``actors``: the ``actors`` table (``danaus.telemetry.query``), each row with its
  restarts (``danaus.supervisor``) and, for a failed actor, its traceback;
- ``meshes``: the actor meshes, from the same rows: class, ranks, how many in each
  state, failures and restarts;
- ``failures`` and ``restarts``: the dashboard's state document's, as the first page
  shows them (a failure carries its traceback and its proc's last log lines);
- ``procs``: every proc of the client's tree, its state and the reason it is lost.
"""

from __future__ import annotations

import importlib
import os
import socket
import sys
import time
from typing import Any

from ..._runtime.logs import dirs as logdir
from ..._runtime.node import Node
from ..web import Route, blocking
from .common import json_route, table

__all__ = ["overview", "routes"]

MAX_JOBS = 50  # the jobs listed from the log directory


def routes(dash: Any) -> dict[str, Route]:
    async def get(request: Any) -> Any:
        state = await blocking(dash.state, True)
        return await blocking(overview, dash.node, state)

    return {"/api/ui/overview": json_route(get)}


def overview(node: Node, state: dict[str, Any]) -> dict[str, Any]:
    """The document (see the module's docstring) from the dashboard's ``state`` (of
    ``node``'s client)."""
    rows = table(node, "SELECT * FROM actors ORDER BY mesh, rank, started")
    restarts = state.get("restarts", [])
    failures = state.get("failures", [])
    counts: dict[tuple[str, int], int] = {}
    for r in restarts:
        for rank in r["ranks"]:
            counts[(r["child"], rank)] = counts.get((r["child"], rank), 0) + 1
    failed = {(f["mesh"], f["rank"]): f for f in failures}
    actors = []
    seen = set()
    for row in rows:
        key = (row["mesh"], row["rank"])
        f = failed.get(key)
        seen.add(key)
        actors.append(
            {
                **row,
                "actor": f"{row['mesh']}[{row['rank']}]",
                "restarts": counts.get(key, 0),
                "failure": row["failure"] or (f["reason"] if f else None),
                "traceback": f["traceback"] if f else "",
                "failed": f is not None or row["state"] in ("failed", "lost"),
            }
        )
    for key, f in failed.items():  # a failure the procs no longer report (a stopped mesh)
        if key not in seen:
            actors.append(
                {
                    "mesh": f["mesh"], "mesh_id": None, "rank": f["rank"], "class": None,
                    "proc": f["proc"], "host": None, "state": "failed", "started": None,
                    "stopped": None, "failure": f["reason"], "received": None, "queued": None,
                    "actor": f["actor"], "restarts": counts.get(key, 0),
                    "traceback": f["traceback"], "failed": True,
                }
            )  # fmt: skip
    procs = [
        {
            k: p[k]
            for k in (
                "proc",
                "mesh",
                "coords",
                "state",
                "reason",
                "pid",
                "host",
                "hostname",
                "parent",
            )
        }
        for h in state.get("hosts", [])
        for p in h["procs"]
    ]
    return {
        "time": time.time(),
        "job": _job(node, state),
        "jobs": _jobs(node),
        "meshes": _meshes(actors),
        "actors": actors,
        "failures": failures,
        "restarts": restarts,
        "procs": procs,
        "totals": state.get("totals", {}),
    }


def _meshes(actors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by: dict[str, list[dict[str, Any]]] = {}
    for a in actors:
        by.setdefault(a["mesh"], []).append(a)
    out = []
    for name, members in by.items():
        states: dict[str, int] = {}
        for a in members:
            states[a["state"]] = states.get(a["state"], 0) + 1
        failed = sum(1 for a in members if a["failed"])
        live = [a for a in members if a["state"] in ("idle", "starting") or
                str(a["state"]).startswith("running")]  # fmt: skip
        out.append(
            {
                "mesh": name,
                "mesh_id": members[0]["mesh_id"],
                "class": next((a["class"] for a in members if a["class"]), None),
                "ranks": len({a["rank"] for a in members}),
                "states": states,
                "state": "failed" if failed else ("alive" if live else "stopped"),
                "failed": failed,
                "restarts": sum(a["restarts"] for a in members),
                "procs": sorted({a["proc"] for a in members if a["proc"]}),
                "hosts": sorted({a["host"] for a in members if a["host"]}),
                "received": sum(a["received"] or 0 for a in members),
            }
        )
    return out


def _job(node: Node, state: dict[str, Any]) -> dict[str, Any]:
    rt = node.runtime
    kept = _history_path()
    return {
        "name": rt.proc_id.name,
        "program": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "pid": os.getpid(),
        "hostname": socket.gethostname(),
        "log_dir": os.path.join(logdir.base_dir(), rt.proc_id.name),
        "history": kept,
        "procs": state.get("totals", {}).get("procs", 0),
        "alive": state.get("totals", {}).get("alive", 0),
        "failures": len(state.get("failures", [])),
    }


def _history_path() -> str | None:
    """The kept history's file, when this client keeps one (``_observe.history``, where
    this danaus has it)."""
    try:
        history = importlib.import_module("danaus._observe.history")
    except ImportError:
        return None
    kept = history.active()
    return None if kept is None else str(kept.path)


def _jobs(node: Node) -> list[dict[str, Any]]:
    """The jobs with a log directory on this host, newest first (``node``'s is current)."""
    current = node.runtime.proc_id.name
    try:
        entries = [e for e in os.scandir(logdir.base_dir()) if e.is_dir(follow_symlinks=False)]
    except OSError:
        return []
    out = []
    for e in sorted(entries, key=lambda e: e.stat().st_mtime, reverse=True)[:MAX_JOBS]:
        try:
            names = os.listdir(e.path)
        except OSError:
            continue
        out.append(
            {
                "name": e.name,
                "current": e.name == current,
                "modified": e.stat().st_mtime,
                "procs": sum(1 for n in names if n.endswith(".json")),
                "history": "telemetry.duckdb" in names,
            }
        )
    return out
