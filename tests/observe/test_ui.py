"""The dashboard pages' data over HTTP: /ui and /api/ui/* (issue 41 part 4).

What a user sees of them is checked in Chromium (test_ui_browser.py); here: the token,
the answers' contents for a live mesh, the Chrome trace export, the log search's
filters, and bad parameters answered 400 with the reason.
"""

from __future__ import annotations

import json
import logging
import re
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import pytest

import danaus.dashboard
from danaus._observe.ui import logsearch
from danaus._runtime.logs import process as proc_logs
from danaus._runtime.node import this_node
from danaus.actor import Actor, ProcMesh, endpoint
from danaus.testing import FaultRecorder

from .conftest import REPLY_TIMEOUT, proc_names


class Talker(Actor):
    """Logs and prints a line naming its rank on each call; fails when told to."""

    @endpoint
    def talk(self, rank: int, step: int) -> int:
        logging.getLogger("talker").warning("ui-test warning rank %d step %d", rank, step)
        print(f"ui-test print rank {rank} step {step}", flush=True)
        return step

    @endpoint
    def fail(self) -> None:
        raise KeyError("failing on purpose for the pages")


def _get(dash: danaus.dashboard.Dashboard, path: str, **params: Any) -> tuple[int, Any, Any]:
    query = urllib.parse.urlencode({"token": dash.token, **params})
    url = f"http://127.0.0.1:{dash.port}{path}?{query}"
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            body = r.read()
            return r.status, r.headers, body
    except urllib.error.HTTPError as e:
        with e:
            return e.code, e.headers, e.read()


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=30):
            return 200
    except urllib.error.HTTPError as e:
        with e:
            return e.code


def _json(dash: danaus.dashboard.Dashboard, path: str, **params: Any) -> Any:
    code, _, body = _get(dash, path, **params)
    assert code == 200, body
    return json.loads(body)


@pytest.fixture(scope="module")
def talkers(procs: ProcMesh, faults: FaultRecorder) -> Any:
    mesh = procs.spawn("ui_talkers", Talker)
    for step in range(3):
        for rank in range(2):
            mesh.slice(gpus=rank).talk.call(rank, step).get(timeout=REPLY_TIMEOUT)
    mesh.slice(gpus=1).fail.broadcast()  # nobody to tell: the actor fails
    faults.crashed("ui_talkers", {1})
    written(procs)
    return mesh


def written(procs: ProcMesh) -> None:
    """Wait until every line ``procs`` wrote so far reached this client: their host agent
    wrote them to the log files before it forwarded them (stdout and stderr are
    separate streams, so one line's arrival says nothing of the other's)."""
    proc_logs.flush(this_node(), list(procs._procs), REPLY_TIMEOUT).result(REPLY_TIMEOUT + 5)


def test_the_pages_need_the_token(dashboard: danaus.dashboard.Dashboard) -> None:
    base = f"http://127.0.0.1:{dashboard.port}"
    for path in ("/ui", "/api/ui/overview", "/api/ui/timeline", "/api/ui/trace.json",
                 "/api/ui/logs", "/api/ui/metrics"):  # fmt: skip
        for suffix, code in (("", 401), ("?token=wrong", 403)):
            assert _status(base + path + suffix) == code, path
    code, headers, body = _get(dashboard, "/ui")
    assert code == 200 and b"<nav" in body and b"/*APP_JS*/" not in body
    # Nothing but the page's own script, style and this server.
    assert "default-src 'none'" in headers["Content-Security-Policy"]
    # No URL but the SVG namespace's name (nothing is loaded from it).
    assert set(re.findall(rb"https?://[^\s\"']+", body)) == {b"http://www.w3.org/2000/svg"}


def test_the_overview_has_the_job_its_meshes_and_the_failed_actor_s_traceback(
    dashboard: danaus.dashboard.Dashboard, talkers: Any, procs: ProcMesh
) -> None:
    doc = _json(dashboard, "/api/ui/overview")

    assert doc["job"]["name"] == this_node().runtime.proc_id.name
    assert any(j["name"] == doc["job"]["name"] and j["current"] for j in doc["jobs"])
    actors = {a["actor"]: a for a in doc["actors"]}
    names = proc_names(procs)
    assert actors["ui_talkers[0]"]["state"] == "idle"
    assert actors["ui_talkers[0]"]["proc"] == names[0]
    failed = actors["ui_talkers[1]"]
    assert failed["failed"] and failed["proc"] == names[1]
    assert "KeyError" in failed["failure"]
    assert "raise KeyError" in failed["traceback"] and "in fail" in failed["traceback"]
    mesh = next(m for m in doc["meshes"] if m["mesh"] == "ui_talkers")
    assert (mesh["class"], mesh["ranks"], mesh["failed"], mesh["state"]) == (
        "Talker",
        2,
        1,
        "failed",
    )


def test_the_timeline_and_its_chrome_trace_hold_the_calls(
    dashboard: danaus.dashboard.Dashboard, talkers: Any
) -> None:
    doc = _json(dashboard, "/api/ui/timeline", seconds=600, actor="ui_talkers[0]")
    talks = [m for m in doc["messages"] if m["endpoint"] == "talk"]
    assert len(talks) == 3 and {m["track"] for m in doc["messages"]} == {"ui_talkers[0]"}
    assert all(doc["since"] <= m["started"] <= m["ended"] <= doc["now"] for m in talks)
    assert any(s["name"] == "Talker.talk" and s["track"] == "ui_talkers[0]" for s in doc["spans"])
    code, headers, body = _get(dashboard, "/api/ui/trace.json", seconds=600)
    assert code == 200 and "attachment" in headers["Content-Disposition"]
    trace = json.loads(body)
    threads = {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in trace["traceEvents"]
        if e["ph"] == "M" and e["name"] == "thread_name"
    }
    complete = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    talk0 = [e for e in complete if e["cat"] == "message" and e["name"] == "talk"
             and threads[(e["pid"], e["tid"])] == "ui_talkers[0]"]  # fmt: skip
    assert len(talk0) == 3 and all(e["dur"] >= 0 and e["ts"] >= 0 for e in talk0)
    raised = [
        e
        for e in complete
        if e["name"] == "fail"
        and e["cat"] == "message"
        and threads[(e["pid"], e["tid"])].startswith("ui_talkers")  # not other tests' meshes
    ]
    assert [e["args"]["ok"] for e in raised] == [False]


def test_the_log_search_filters_by_mesh_rank_level_and_text(
    dashboard: danaus.dashboard.Dashboard, talkers: Any
) -> None:
    def lines(**params: Any) -> list[str]:
        return [x["text"] for x in _json(dashboard, "/api/ui/logs", **params)["lines"]]

    rank1 = lines(mesh="ui_talkers", rank=1, q="ui-test")
    assert rank1 and all("rank 1" in t for t in rank1)
    assert len(rank1) == 6  # 3 records and 3 prints of rank 1, none of rank 0
    assert sum(t.startswith("WARNING talker:") and "warning rank 1" in t for t in rank1) == 3
    assert sum(t.startswith("ui-test print rank 1") for t in rank1) == 3
    warned = lines(mesh="ui_talkers", level="WARNING", q="ui-test")
    assert len(warned) == 6 and all(t.startswith("WARNING talker:") for t in warned)
    assert lines(mesh="ui_talkers", level="ERROR", q="ui-test") == []
    assert len(lines(q="UI-TEST PRINT RANK 0")) == 3  # case-insensitive
    assert lines(mesh="no_such_mesh", q="ui-test") == []


def test_the_metrics_give_a_series_per_actor_and_endpoint(
    dashboard: danaus.dashboard.Dashboard, talkers: Any
) -> None:
    doc = _json(dashboard, "/api/ui/metrics", name="calls", seconds=600, mesh="ui_talkers")
    assert doc["kind"] == "counter"
    talk = {s["label"]: s["points"] for s in doc["series"] if s["endpoint"] == "talk"}
    assert set(talk) == {"ui_talkers[0].talk", "ui_talkers[1].talk"}
    assert talk["ui_talkers[0].talk"][-1][1] == 3.0
    queued = _json(dashboard, "/api/ui/metrics", name="queued", mesh="ui_talkers")
    assert queued["kind"] == "gauge"
    # the data plane's per-proc counters (issue 41 part 5) can be plotted too
    moved = _json(dashboard, "/api/ui/metrics", name="transfer_bytes", seconds=600)
    assert moved["kind"] == "counter"
    assert "transfer_bytes" in moved["names"]


def test_bad_parameters_are_answered_400_with_the_reason(
    dashboard: danaus.dashboard.Dashboard,
) -> None:
    for path, params, words in (
        ("/api/ui/logs", {"level": "LOUD"}, "level must be one of"),
        ("/api/ui/logs", {"rank": "x"}, "rank must be a whole number"),
        ("/api/ui/metrics", {"name": "nope"}, "no metric 'nope'"),
        ("/api/ui/timeline", {"seconds": "nan"}, "seconds must be a number"),
        ("/api/ui/trace.json", {"seconds": "-1"}, "seconds must be a number"),
    ):
        code, _, body = _get(dashboard, path, **params)
        assert code == 400 and words in body.decode(), (path, body)


def test_log_levels_follow_records_and_their_tracebacks() -> None:
    lines = [
        "plain print",
        "ERROR trainer: step failed",
        "Traceback (most recent call last):",
        '  File "x.py", line 1, in f',
        "ValueError: bad",
        "after the record",
        "INFO data: loaded",
        "KeyError: not after a traceback",
    ]
    assert logsearch.levels(lines) == [
        None, "ERROR", "ERROR", "ERROR", "ERROR", None, "INFO", None
    ]  # fmt: skip
