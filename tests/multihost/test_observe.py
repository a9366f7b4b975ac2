"""Observing across hosts: procs an actor spawned on another host, in the state and traces."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import danaus
from danaus._observe.state import StateCollector
from danaus._runtime.node import this_node
from danaus.actor import Actor, ProcMesh, endpoint, this_host

from .conftest import TIMEOUT, Probe


class Launcher(Actor):
    """Spawns procs on its own host (``this_host()`` there) and calls them."""

    def __init__(self) -> None:
        self.pm: Any = None
        self.inner: Any = None

    @endpoint
    def launch(self) -> list[str]:
        self.pm = this_host().spawn_procs(per_host={"gpus": 2})
        self.inner = self.pm.spawn("far_inner", Probe)
        self.inner.initialized.get(timeout=TIMEOUT)
        return [p.proc for p in self.pm.stats().get(timeout=TIMEOUT).procs]

    @endpoint
    def echo_inner(self, x: int) -> list[Any]:
        return list(self.inner.echo.call(x).get(timeout=TIMEOUT).values())

    @endpoint
    def stop_inner(self) -> None:
        self.pm.stop().get(timeout=TIMEOUT)


def test_procs_an_actor_spawned_on_another_host_are_observed(
    procs: ProcMesh, tmp_path: Path
) -> None:
    launcher = procs.slice(hosts=2, gpus=1).spawn("far_launcher", Launcher)
    [parent] = [p.proc for p in procs.slice(hosts=2, gpus=1).stats().get(timeout=TIMEOUT).procs]
    inner = launcher.launch.call_one().get(timeout=TIMEOUT)
    try:
        state = StateCollector(this_node()).collect()
        by_name = {p["proc"]: (h, p) for h in state["hosts"] for p in h["procs"]}
        parent_host = by_name[parent][0]["host"]
        for name in inner:
            h, p = by_name[name]
            assert p["state"] == "alive" and p["parent"] == parent, p
            assert h["host"] == parent_host  # grouped with its parent's host, not the client's
            assert [a["name"] for a in p["actors"]] == ["far_inner"]

        path = tmp_path / "far.json"
        with danaus.trace(path) as t:
            assert launcher.echo_inner.call_one(3).get(timeout=TIMEOUT) == [3, 3]
        assert t.summary["procs_missing"] == []
        doc = json.loads(path.read_text())
        names = {
            e["pid"]: e["args"]["name"]
            for e in doc["traceEvents"]
            if e["ph"] == "M" and e["name"] == "process_name"
        }
        spans = [e for e in doc["traceEvents"] if e["ph"] == "X"]
        executed = [e for e in spans if e["name"] == "far_inner.echo"]
        assert sorted(n for e in executed for n in inner if n in names[e["pid"]]) == sorted(inner)
        [outer] = [e for e in spans if e["name"] == "far_launcher.echo_inner"]
        assert {e["pid"] for e in executed}.isdisjoint({outer["pid"]})
    finally:
        launcher.stop_inner.call_one().get(timeout=TIMEOUT)
