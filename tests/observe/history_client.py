"""A client that test_history.py runs in a process of its own (a job's telemetry turns
OpenTelemetry on, which is process-global): it keeps telemetry history as
``TelemetryConfig`` says, and prints what it saw as JSON (last line).

``python history_client.py kept``: snapshots every 0.2 s; calls, then waits for a
periodic snapshot (no query) to write them; stops the procs, then queries: the
stopped procs' actors and messages are still there.

``python history_client.py retention``: retention of 1 s: the rows of old calls are
swept while the job runs.
"""

from __future__ import annotations

import json
import sys
import time

from danaus.actor import Actor, endpoint
from danaus.job import LocalJob, TelemetryConfig

TIMEOUT = 60.0


class W(Actor):
    @endpoint
    def early(self) -> int:
        return 1

    @endpoint
    def late(self) -> int:
        return 2


def _count(h: object, sql: str) -> int:
    cur = h.cursor()  # type: ignore[attr-defined]
    try:
        return int(cur.execute(sql).fetchone()[0])
    finally:
        cur.close()


def _wait(probe, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not probe():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {probe}")
        time.sleep(0.05)


def main(scenario: str) -> None:
    from danaus._observe import history

    retention = 1 if scenario == "retention" else 3600
    job = LocalJob().enable_telemetry(
        TelemetryConfig(retention_secs=retention, snapshot_interval_secs=0.2)
    )
    state = job.state(cached_path=None)
    h = history.active()
    assert h is not None
    procs = state.hosts.spawn_procs(per_host={"gpus": 2})
    w = procs.spawn("kept", W)
    out: dict[str, object] = {"path": h.path}
    for _ in range(3):
        w.early.call().get(timeout=TIMEOUT)
    # A periodic snapshot writes them: nothing here asks. With a 1 s window a sweep may
    # delete them before this thread looks (under load): each sweep notes what it found.
    early = "SELECT count(*) FROM messages WHERE endpoint = 'early'"
    found = [0]
    sweep = h.sweep

    def noting_sweep() -> int:
        found[0] = max(found[0], _count(h, early))
        return sweep()

    h.sweep = noting_sweep  # type: ignore[method-assign]
    _wait(lambda: max(found[0], _count(h, early)) == 6)
    out["snapshots"] = h.snapshots
    if scenario == "kept":
        # one more periodic snapshot while the procs live: the metrics are a time series
        seen = h.snapshots
        _wait(lambda: h.snapshots > seen)
        procs.stop().get(timeout=TIMEOUT)
        from danaus.telemetry import query

        class Q:  # danaus's own tables (state.query_engine_client answers Monarch's)
            @staticmethod
            def query(sql: str) -> dict[str, object]:
                return {"rows": [list(row.values()) for row in query(sql)]}

        q = Q()
        out["actors"] = q.query("SELECT rank, state FROM actors WHERE mesh = 'kept' ORDER BY rank")
        out["messages"] = q.query(
            "SELECT count(*) AS n FROM messages WHERE mesh = 'kept' AND endpoint = 'early'"
        )
        out["metrics"] = q.query(
            "SELECT count(DISTINCT time) AS n FROM metrics WHERE mesh = 'kept' AND name = 'calls'"
        )
    else:
        time.sleep(1.2)
        for _ in range(2):
            w.late.call().get(timeout=TIMEOUT)
        # the sweep (every second, for a 1 s window) deletes the early calls' rows
        _wait(lambda: _count(h, "SELECT count(*) FROM messages WHERE endpoint = 'early'") == 0)
        out["swept"] = h.swept
        out["early_spans"] = _count(h, "SELECT count(*) FROM spans WHERE name = 'W.early'")
        procs.stop().get(timeout=TIMEOUT)
    print(json.dumps(out), flush=True)
    job.kill()


if __name__ == "__main__":
    main(sys.argv[1])
