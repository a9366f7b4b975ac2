"""Issue 41 part 3: telemetry kept in an embedded DuckDB file in the job's directory,
with ``retention_secs`` and ``snapshot_interval_secs`` doing what Monarch documents, the
SQL tables read from it (a stopped proc's rows stay queryable), and ``danaus query
--job`` reading a finished job's file. The clients run in processes of their own
(``history_client.py``): a job's telemetry turns OpenTelemetry on process-wide.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

import danaus.dashboard
from danaus._observe import history
from danaus._runtime.node import this_node
from danaus.actor import ProcMesh
from danaus.testing import wait_until

from .conftest import REPLY_TIMEOUT, Worker

CLIENT = Path(__file__).with_name("history_client.py")
SRC = Path(history.__file__).resolve().parents[2]


def _run(scenario: str, env: dict[str, str]) -> dict[str, Any]:
    r = subprocess.run(
        [sys.executable, str(CLIENT), scenario],
        capture_output=True,
        text=True,
        timeout=150,
        env={**os.environ, "PYTHONPATH": str(SRC), **env},
        cwd=CLIENT.parent,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-6000:]
    return json.loads(r.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "danaus", "query", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(SRC), **env},
    )


@pytest.mark.timeout(180)
def test_a_jobs_telemetry_is_kept_and_read_after_its_procs_and_the_job_are_gone(
    tmp_path: Path,
) -> None:
    env = {"DANAUS_LOG_DIR": str(tmp_path)}
    got = _run("kept", env)
    path = Path(got["path"])
    assert path.parent.parent == tmp_path and path.name == "telemetry.duckdb"
    assert got["snapshots"] >= 1  # written by the periodic snapshots, before any query
    # After procs.stop(): the actors and their messages are still there.
    assert got["actors"]["rows"] == [[0, "idle"], [1, "idle"]]
    assert got["messages"]["rows"] == [[6]]
    assert got["metrics"]["rows"][0][0] >= 2  # a time series: one row per snapshot

    # The job has ended; its file answers from the command line.
    job = path.parent.name
    r = _cli("--job", job, "--json", "SELECT endpoint, count(*) AS n FROM messages "
             "WHERE mesh = 'kept' GROUP BY endpoint", env=env)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert [json.loads(line) for line in r.stdout.splitlines()] == [{"endpoint": "early", "n": 6}]
    r = _cli("--job", "", "SELECT rank FROM actors WHERE mesh = 'kept' ORDER BY rank", env=env)
    assert r.returncode == 0, r.stderr  # no name: the latest job
    assert r.stdout.splitlines()[2:] == ["   0", "   1", "(2 rows)"]
    # Read-only, as a live query: anything but one SELECT is refused, naming why.
    r = _cli("--job", job, "DELETE FROM messages", env=env)
    assert r.returncode == 2 and "only SELECT queries are allowed" in r.stderr
    r = _cli("--job", "nosuchjob", "SELECT 1", env=env)
    assert r.returncode == 2 and "no job named 'nosuchjob'" in r.stderr


@pytest.mark.timeout(180)
def test_rows_older_than_retention_secs_are_swept_while_the_job_runs(tmp_path: Path) -> None:
    got = _run("retention", {"DANAUS_LOG_DIR": str(tmp_path)})
    assert got["swept"] > 0 and got["early_spans"] == 0


def test_the_sweep_runs_as_monarch_documents() -> None:
    """A tenth of the window, within 30 s to 5 minutes, never longer than the window."""
    assert history.sweep_interval(3600) == 300
    assert history.sweep_interval(600) == 60
    assert history.sweep_interval(100) == 30
    assert history.sweep_interval(10) == 10
    assert history.sweep_interval(1) == 1


def test_a_job_without_kept_telemetry_says_so(tmp_path: Path) -> None:
    (tmp_path / "c0ffee").mkdir()
    r = _cli("--job", "c0ffee", "SELECT 1", env={"DANAUS_LOG_DIR": str(tmp_path)})
    assert r.returncode == 2 and "kept no telemetry" in r.stderr
    assert "enable_telemetry" in r.stderr


def test_the_dashboard_plots_start_with_the_kept_history(
    procs: ProcMesh, dashboard: danaus.dashboard.Dashboard
) -> None:
    """``/api/history``: each endpoint's calls per second and mean latency between the
    history's snapshots, which the page draws before its live samples."""
    assert _get(dashboard, "/api/history") == {"kept": False, "series": []}
    h = history.start(this_node(), 3600, 0.1)
    try:
        workers = procs.spawn("plotted", Worker)
        for _ in range(3):
            for _ in range(10):
                workers.ping.call(None).get(timeout=REPLY_TIMEOUT)
            snapped = h.snapshots
            wait_until(lambda s=snapped: h.snapshots >= s + 2, timeout=30)  # type: ignore[misc]
        # One time per snapshot, whichever proc answered when: a series groups by it.
        cur = h.cursor()
        try:
            per_time = cur.execute(
                "SELECT count(DISTINCT proc) FROM metrics WHERE mesh = 'plotted' GROUP BY time"
            ).fetchall()
        finally:
            cur.close()
        assert len(per_time) >= 2 and {n for (n,) in per_time} == {2}
        got = _get(dashboard, "/api/history", seconds="600")
        assert got["kept"] and got["path"] == h.path
        [sr] = [s for s in got["series"] if s["mesh"] == "plotted"]
        assert sr["endpoint"] == "ping"
        points = sr["points"]
        assert len(points) >= 2 and all(
            t0 < t1 for (t0, *_), (t1, *_) in itertools.pairwise(points)
        )
        assert any(rate > 0 for _, rate, _ in points) and all(rate >= 0 for _, rate, _ in points)
        # the calls the series counts between its first and last snapshot: at most the 60 made
        counted = sum(rate * (t1 - t0) for (t0, *_), (t1, rate, _) in itertools.pairwise(points))
        assert 0 < counted <= 60 + 1e-6
        assert all(mean is None or 0 < mean < 10 for _, _, mean in points)
        assert _status_of(dashboard, "/api/history", seconds="-1") == 400
    finally:
        history.stop(h)
    assert history.active() is None


def _get(dash: danaus.dashboard.Dashboard, path: str, **params: Any) -> Any:
    query = urllib.parse.urlencode({"token": dash.token, **params})
    with urllib.request.urlopen(f"http://127.0.0.1:{dash.port}{path}?{query}", timeout=60) as r:
        return json.load(r)


def _status_of(dash: danaus.dashboard.Dashboard, path: str, **params: Any) -> int:
    try:
        _get(dash, path, **params)
    except urllib.error.HTTPError as e:
        return e.code
    return 200
