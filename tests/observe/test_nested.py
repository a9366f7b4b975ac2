"""Procs that an actor spawned (not the client): on the dashboard, in `danaus top`, in traces."""

from __future__ import annotations

import json
import os
import signal
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

import danaus
import danaus.dashboard
from danaus._cli import observe as observe_cli
from danaus.actor import ProcMesh
from danaus.testing import wait_until

from .conftest import REPLY_TIMEOUT, Parent, proc_names


def _get(dash: danaus.dashboard.Dashboard, path: str, **params: Any) -> Any:
    query = urllib.parse.urlencode({"token": dash.token, **params}, doseq=True)
    with urllib.request.urlopen(f"http://127.0.0.1:{dash.port}{path}?{query}", timeout=60) as r:
        return json.load(r)


def _procs_of(state: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {p["proc"]: p for h in state["hosts"] for p in h["procs"]}


def test_procs_an_actor_spawned_are_in_the_state_top_and_stack_dumps(
    dashboard: danaus.dashboard.Dashboard, procs: ProcMesh
) -> None:
    parent = procs.slice(gpus=0).spawn("nested_parent", Parent)
    [parent_proc] = proc_names(procs.slice(gpus=0))
    children = parent.spawn_children.call_one("nested_workers", 2).get(timeout=REPLY_TIMEOUT)
    assert parent.ping_children.call_one("nested_workers", 5).get(timeout=REPLY_TIMEOUT) == [5, 5]

    state = _get(dashboard, "/api/state")
    by_name = _procs_of(state)
    assert by_name[parent_proc]["parent"] is None
    nested = [by_name[c] for c in children]
    assert [p["coords"] for p in nested] == [{"gpus": 0}, {"gpus": 1}]
    for p in nested:
        assert p["state"] == "alive" and p["parent"] == parent_proc
        assert p["mesh"] == f"{parent_proc}/0"
        assert "nested_parent" in p["spawner"]
        [actor] = p["actors"]
        assert actor["name"] == "nested_workers" and actor["endpoints"]["ping"]["calls"] == 1
    assert state["totals"]["procs"] >= len(procs) + 2

    rows = observe_cli.rows(state)
    assert any(r[0].strip().startswith(children[1]) and parent_proc in r[0] for r in rows)

    # A stack dump by the nested actor mesh's name, and by the nested proc mesh's label.
    [dump] = _get(dashboard, "/api/stack", mesh="nested_workers", coords="gpus=1")["dumps"]
    assert dump["ok"] and dump["proc"] == children[1]
    [dump] = _get(dashboard, "/api/stack", mesh=f"{parent_proc}/0", coords="0")["dumps"]
    assert dump["proc"] == children[0]

    # A nested proc that dies shows as dead, with its parent's reason.
    pids = parent.child_pids.call_one("nested_workers").get(timeout=REPLY_TIMEOUT)
    os.kill(pids[1], signal.SIGKILL)
    dead = wait_until(
        lambda: _procs_of(_get(dashboard, "/api/state"))[children[1]],
        REPLY_TIMEOUT,
        "the killed nested proc shows SIGKILL",
        until=lambda proc: "SIGKILL" in (proc["reason"] or ""),
        interval=0,
    )
    assert dead["state"] == "dead" and "SIGKILL" in dead["reason"], dead
    assert dead["parent"] == parent_proc
    assert _procs_of(_get(dashboard, "/api/state"))[children[0]]["state"] == "alive"

    # Stopped by their parent: gone from the tree.
    parent.stop_children.call_one("nested_workers").get(timeout=REPLY_TIMEOUT)
    assert not set(children) & set(_procs_of(_get(dashboard, "/api/state")))
    assert parent.seen_failures.call_one().get(timeout=REPLY_TIMEOUT)


def _trace_procs(doc: dict[str, Any]) -> dict[int, str]:
    return {
        e["pid"]: e["args"]["name"]
        for e in doc["traceEvents"]
        if e["ph"] == "M" and e["name"] == "process_name"
    }


@pytest.mark.timeout(120)
def test_a_trace_has_the_spans_of_procs_an_actor_spawned(procs: ProcMesh, tmp_path: Path) -> None:
    parent = procs.slice(gpus=1).spawn("tracing_parent", Parent)
    before = parent.spawn_children.call_one("traced_before", 1).get(timeout=REPLY_TIMEOUT)
    path = tmp_path / "nested.json"
    with danaus.trace(path) as t:
        parent.ping_children.call_one("traced_before", 1).get(timeout=REPLY_TIMEOUT)
        during = parent.spawn_children.call_one("traced_during", 1).get(timeout=REPLY_TIMEOUT)
        parent.ping_children.call_one("traced_during", 2).get(timeout=REPLY_TIMEOUT)
    assert t.summary["procs_missing"] == [] and t.summary["dropped"] == 0
    doc = json.loads(path.read_text())
    names = _trace_procs(doc)
    spans = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    for mesh, (child,) in (("traced_before", before), ("traced_during", during)):
        [executed] = [e for e in spans if e["name"] == f"{mesh}.ping"]
        assert child in names[executed["pid"]]
        # One clock: the nested execution lies inside the parent's call that caused it.
        [outer] = [
            e
            for e in spans
            if e["name"] == "tracing_parent.ping_children"
            and e["ts"] <= executed["ts"] <= e["ts"] + e["dur"]
        ]
        assert executed["ts"] + executed["dur"] <= outer["ts"] + outer["dur"]
        assert outer["pid"] != executed["pid"]
    for name in ("traced_before", "traced_during"):
        parent.stop_children.call_one(name).get(timeout=REPLY_TIMEOUT)
