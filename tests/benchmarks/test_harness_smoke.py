"""The benchmark harness works: its smoke mode gives a number for every workload.

Runs ``benchmarks/run.py --smoke`` for danaus and the physical floor only (the
comparators are optional and not installed in CI). It checks that the harness
produced a number, never how fast anything was: no timing thresholds here.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RUN = REPO / "benchmarks" / "run.py"
SYSTEMS = ("danaus", "floor")


@pytest.mark.timeout(240)
def test_smoke_run_gives_a_number_for_every_workload(tmp_path: Path) -> None:
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        from workloads import WORKLOADS
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    out = tmp_path / "smoke.json"
    proc = subprocess.run(
        # --no-guard: the regression guard compares timings, which tests never do
        # (test_guard.py checks its arithmetic; CI runs it, scripts/bench-guard).
        [
            sys.executable,
            str(RUN),
            "--smoke",
            "--no-guard",
            "--systems",
            ",".join(SYSTEMS),
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=200,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["meta"]["mode"] == "smoke"
    missing = []
    for wl in WORKLOADS:
        for system in SYSTEMS:
            entry = doc["results"][wl.name][system]
            value = entry.get("median")
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                missing.append(f"{wl.name}/{system}: {entry.get('failure')} {entry.get('error')}")
    assert not missing, "\n".join(missing) + "\n" + proc.stdout[-3000:]
    # The table was printed, with a row per workload and the danaus/floor ratio.
    assert "danaus/floor" in proc.stdout
    for wl in WORKLOADS:
        assert wl.name in proc.stdout
