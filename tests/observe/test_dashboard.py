"""The dashboard's HTTP side: authentication, the JSON API, live events, stack dumps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import pytest

import danaus.dashboard
from danaus._observe import logtail
from danaus._runtime.node import this_node
from danaus.actor import Actor, ProcMesh, endpoint
from danaus.testing import FaultRecorder, client_env, wait_until

from .conftest import REPLY_TIMEOUT, Worker, proc_names


def _get(dash: danaus.dashboard.Dashboard, path: str, **params: Any) -> Any:
    query = urllib.parse.urlencode({"token": dash.token, **params}, doseq=True)
    with urllib.request.urlopen(f"http://127.0.0.1:{dash.port}{path}?{query}", timeout=60) as r:
        return json.load(r)


def _status(url: str, headers: dict[str, str] | None = None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=30):
            return 200
    except urllib.error.HTTPError as e:
        return e.code


class Holder(Actor):
    """Registers an RDMA buffer, and fails when told to (with no one to tell)."""

    def __init__(self) -> None:
        from danaus.rdma import RDMABuffer

        self.buf = RDMABuffer(memoryview(bytearray(4096)))

    @endpoint
    def fail(self) -> None:
        raise KeyError("failing on purpose for the dashboard")


def _procs_of(state: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {p["proc"]: p for h in state["hosts"] for p in h["procs"]}


def test_every_path_needs_the_token(dashboard: danaus.dashboard.Dashboard) -> None:
    base = f"http://127.0.0.1:{dashboard.port}"
    for path in ("/", "/api/state", "/api/events", "/api/stack", "/nope"):
        assert _status(base + path) == 401  # no token: the client may authenticate
        assert _status(base + path + "?token=wrong") == 403
        assert _status(base + path + "?token=" + dashboard.token[:-1]) == 403
    assert _status(base + "/?token=" + dashboard.token) == 200
    bearer = {"Authorization": f"Bearer {dashboard.token}"}
    assert _status(base + "/api/state", bearer) == 200
    assert dashboard.host == "127.0.0.1"
    assert dashboard.url == f"http://127.0.0.1:{dashboard.port}/?token={dashboard.token}"


def test_the_state_shows_procs_actors_metrics_logs_rdma_and_failures(
    dashboard: danaus.dashboard.Dashboard, procs: ProcMesh, faults: FaultRecorder
) -> None:
    workers = procs.spawn("dash_workers", Worker)
    holders = procs.slice(gpus=1).spawn("holders", Holder)
    for i in range(5):
        workers.ping.call(i).get(timeout=REPLY_TIMEOUT)
    with pytest.raises(danaus.actor.ActorError):
        workers.boom.call().get(timeout=REPLY_TIMEOUT)
    holders.fail.broadcast()  # nobody to tell: the actor fails, its owner (us) hears
    faults.crashed("holders", {0})
    [p0], [p1] = proc_names(procs.slice(gpus=0)), proc_names(procs.slice(gpus=1))
    logtail.append(p0, "a line the log forwarder delivered", "stderr")

    state = _get(dashboard, "/api/state")
    ours = {name: p for name, p in _procs_of(state).items() if name in {p0, p1}}
    assert len(ours) == 2 and all(p["state"] == "alive" for p in ours.values())
    assert ours[p0]["coords"] == {"gpus": 0}
    assert ours[p0]["logs"][-1]["line"] == "a line the log forwarder delivered"
    actors = {a["actor"]: a for p in ours.values() for a in p["actors"]}
    w1 = actors["dash_workers[1]"]
    assert w1["class"] == "Worker" and w1["state"] == "idle" and w1["queued"] == 0
    assert w1["endpoints"]["ping"]["calls"] == 5 and w1["endpoints"]["boom"]["errors"] == 1
    assert sum(c for _, c in w1["endpoints"]["ping"]["histogram"]) == 5
    assert actors["holders[0]"]["state"] == "failed"
    assert [b["nbytes"] for b in ours[p1]["rdma"]] == [4096]
    assert any(c["frames_recv"] > 0 for c in ours[p1]["connections"])
    [failure] = [f for f in state["failures"] if f["actor"] == "holders[0]"]
    assert "KeyError" in failure["reason"] + failure["traceback"]
    assert "failing on purpose" in failure["traceback"]
    assert failure["proc"] == p1
    assert state["totals"]["procs"] >= 2 and state["client"]["pid"] == os.getpid()


def _mesh_of(state: dict[str, Any], name: str) -> dict[str, Any]:
    [mesh] = [m for m in state["meshes"] if m["name"] == name]
    return mesh


def test_the_state_s_meshes_give_each_interval_s_calls_and_latency(procs: ProcMesh) -> None:
    """What the page's picture and plots draw: ranks with their procs and states, and per
    endpoint the calls, rate and percentiles of the last interval alone."""
    from danaus._observe.state import StateCollector

    plotted = procs.spawn("plotted", Worker)
    plotted.initialized.get(timeout=REPLY_TIMEOUT)
    collector = StateCollector(this_node())  # its own: intervals between its own collections
    first = _mesh_of(collector.collect(), "plotted")
    assert first["class"] == "Worker" and first["state"] == "alive"
    assert [(r["rank"], r["proc"], r["state"]) for r in first["ranks"]] == [
        (i, name, "idle") for i, name in enumerate(proc_names(procs))
    ]
    assert first["endpoints"] == {}  # no calls yet
    for i in range(7):
        plotted.ping.call(i).get(timeout=REPLY_TIMEOUT)  # both ranks: 14 calls
    ping = _mesh_of(collector.collect(), "plotted")["endpoints"]["ping"]
    # The first collection that sees an endpoint has nothing to compare with.
    assert ping == {"calls": 14, "interval_calls": None, "rate": None, "p50_s": None, "p99_s": None}
    for i in range(3):
        plotted.ping.call(i).get(timeout=REPLY_TIMEOUT)
    ping = _mesh_of(collector.collect(), "plotted")["endpoints"]["ping"]
    assert ping["calls"] == 20 and ping["interval_calls"] == 6 and ping["rate"] > 0
    assert 0 < ping["p50_s"] <= ping["p99_s"]
    ping = _mesh_of(collector.collect(), "plotted")["endpoints"]["ping"]
    assert ping["interval_calls"] == 0 and ping["rate"] == 0
    assert ping["p50_s"] is None and ping["p99_s"] is None  # no call in this interval
    plotted.stop().get(timeout=REPLY_TIMEOUT)


def test_a_rank_its_supervisor_is_restarting_shows_restarting(faults: FaultRecorder) -> None:
    from danaus._observe.state import StateCollector
    from danaus.actor import this_host
    from danaus.supervisor import Backoff, Supervisor

    pm = this_host().spawn_procs(per_host={"gpus": 2})
    # A backoff longer than the test: the failed rank stays "being restarted" until stop().
    sup = Supervisor(max_restarts=1, backoff=Backoff(3600.0, 3600.0), name="dash_sup")
    try:
        kept = sup.spawn(pm, "kept", Worker)
        kept.initialized.get(timeout=REPLY_TIMEOUT)
        collector = StateCollector(this_node())
        assert _mesh_of(collector.collect(), "kept")["state"] == "alive"
        kept.slice(gpus=1).boom.broadcast()  # the actor fails; its supervisor hears
        wait_until(
            lambda: _mesh_of(collector.collect(), "kept")["state"] == "restarting",
            REPLY_TIMEOUT,
            "the dashboard's state showing the restart",
        )
        mesh = _mesh_of(collector.collect(), "kept")
        assert [r["state"] for r in mesh["ranks"]] == ["idle", "restarting"]
    finally:
        sup.stop().get(timeout=REPLY_TIMEOUT)
        pm.stop().get(timeout=REPLY_TIMEOUT)


class Printer(danaus.actor.Actor):
    @danaus.actor.endpoint
    def say(self, text: str) -> Any:
        """Print ``text``; return the proc that printed it (its ``ProcId``)."""
        print(text, flush=True)
        return danaus.actor.context().actor_instance.actor_id.proc


def test_a_procs_forwarded_output_is_its_log_tail(
    dashboard: danaus.dashboard.Dashboard, procs: ProcMesh
) -> None:
    from danaus._runtime.logs import process as logs
    from danaus._runtime.node import this_node

    printers = procs.slice(gpus=0).spawn("dash_printers", Printer)
    marker = f"dashboard tail {os.getpid()}-{time.monotonic_ns()}"
    [proc] = printers.say.call(marker).get(timeout=REPLY_TIMEOUT).values()
    logs.flush(this_node(), [proc], REPLY_TIMEOUT).result(timeout=REPLY_TIMEOUT)
    state = _get(dashboard, "/api/state")
    p0 = _procs_of(state)[proc.name]
    assert any(marker in entry["line"] for entry in p0["logs"]), p0["logs"][-5:]


def test_events_stream_the_state_as_it_changes(
    dashboard: danaus.dashboard.Dashboard, procs: ProcMesh
) -> None:
    mesh = procs.spawn("streamed", Worker)
    mesh.initialized.get(timeout=REPLY_TIMEOUT)
    url = f"http://127.0.0.1:{dashboard.port}/api/events?token={dashboard.token}"
    calls = []
    with urllib.request.urlopen(url, timeout=60) as r:
        assert r.headers["Content-Type"] == "text/event-stream"
        for line in r:
            if not line.startswith(b"data: "):
                continue
            state = json.loads(line[len(b"data: ") :])
            actors = [a for h in state["hosts"] for p in h["procs"] for a in p["actors"]]
            n = sum(a["received"] for a in actors if a["name"] == "streamed")
            calls.append(n)
            if len(calls) == 1:
                mesh.ping.call(1).get(timeout=REPLY_TIMEOUT)  # the next documents see it
            if n >= 2:
                break
    assert calls[0] == 0 and calls[-1] == 2


def test_a_stack_dump_shows_what_an_actor_is_doing(
    dashboard: danaus.dashboard.Dashboard, procs: ProcMesh
) -> None:
    mesh = procs.spawn("stacked", Worker)
    held = mesh.slice(gpus=1).hold.call_one("dump-me", REPLY_TIMEOUT)
    try:
        answer = _get(dashboard, "/api/stack", mesh="stacked", coords="gpus=1")
    finally:
        procs.slice(gpus=1).spawn("releaser", Worker).release.call_one("dump-me").get(
            timeout=REPLY_TIMEOUT
        )
    assert held.get(timeout=REPLY_TIMEOUT) is True
    [dump] = answer["dumps"]
    assert dump["ok"] and dump["proc"] == proc_names(procs.slice(gpus=1))[0]
    assert "hold" in dump["dump"] and "actor-stacked" in dump["dump"]


def test_a_bad_stack_request_says_what_was_wrong(dashboard: danaus.dashboard.Dashboard) -> None:
    for params, words in (
        ({}, "say which procs"),
        ({"mesh": "no-such-mesh"}, "no mesh 'no-such-mesh'"),
        ({"proc": "p-nope"}, "no proc"),
        ({"mesh": "0", "coords": "gpus=x"}, "neither all named"),
    ):
        with pytest.raises(urllib.error.HTTPError) as info:
            _get(dashboard, "/api/stack", **params)
        assert info.value.code == 400
        assert words in json.loads(info.value.read())["error"]


def test_the_environment_switch_serves_the_dashboard_at_the_first_spawn() -> None:
    code = (
        "import json, sys, urllib.request\n"
        "from danaus.actor import this_host\n"
        "pm = this_host().spawn_procs(per_host={'gpus': 1})\n"
        "pm.initialized.get(timeout=30)\n"
        "url = sys.stdin.readline().strip()\n"
        "s = json.load(urllib.request.urlopen(url.replace('/?', '/api/state?'), timeout=30))\n"
        "print('PROCS', s['totals']['procs'], flush=True)\n"
    )
    env = {**client_env(), "DANAUS_DASHBOARD": "1"}
    p = subprocess.Popen(
        [sys.executable, "-c", code],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stderr is not None and p.stdin is not None
        line = p.stderr.readline()
        assert line.startswith("danaus dashboard: http://127.0.0.1:"), line
        p.stdin.write(line.split(": ", 1)[1])
        p.stdin.flush()
        out, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert "PROCS 1" in out, err
