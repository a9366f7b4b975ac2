"""The smoke run's regression guard (``benchmarks/run.py``), on made-up numbers.

Only the arithmetic: which ratio is compared with which limit, in which
direction, when a failure is measured again, and what a recorded baseline
holds. No timing is measured here.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run() -> Iterator[Any]:
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import run as module

        yield module
    finally:
        sys.path.remove(str(REPO / "benchmarks"))


def _raw(runs: dict[str, dict[str, list[list[list[float]]]]], work: float = 1.0) -> Any:
    """``raw`` as run.py keeps it: per workload and system, one entry per worker run;
    ``runs[wl][system][round]`` lists the sample lists of that round's runs."""
    return {
        wl: {
            system: [
                {"round": rnd, "status": "ok", "samples": samples, "work": work}
                for rnd, in_round in enumerate(rounds)
                for samples in in_round
            ]
            for system, rounds in per.items()
        }
        for wl, per in runs.items()
    }


def test_times_fail_beyond_twice_the_baseline_and_rates_below_half(run: Any) -> None:
    raw = _raw(
        {
            "call_one": {"danaus": [[[100e-6, 120e-6]]], "floor": [[[10e-6, 30e-6]]]},  # 10x
            "throughput": {"danaus": [[[0.5, 1.0]]], "floor": [[[0.01]]]},  # rate ratio 0.02
        }
    )
    ok = run.check_guard(raw, {"ratios": {"call_one": 5.0, "throughput": 0.04}})
    assert [(r["workload"], r["status"]) for r in ok] == [("call_one", "ok"), ("throughput", "ok")]
    assert ok[0]["ratio"] == pytest.approx(10.0) and ok[0]["limit"] == pytest.approx(10.0)
    assert ok[1]["ratio"] == pytest.approx(0.02) and ok[1]["limit"] == pytest.approx(0.02)
    bad = run.check_guard(raw, {"ratios": {"call_one": 4.9, "throughput": 0.041}})
    assert [r["status"] for r in bad] == ["REGRESSED", "REGRESSED"]
    assert all(r["failed"] for r in bad)


def test_the_ratio_is_the_median_over_pairs_of_best_samples(run: Any) -> None:
    # Three danaus runs, each after a floor run; a slow tail moves no best sample,
    # and one pair measured during a burst of load does not move the median.
    raw = _raw(
        {
            "call_one": {
                "danaus": [[[100e-6] + [900e-6] * 9, [110e-6], [400e-6]]],
                "floor": [[[10e-6] * 10, [10e-6], [10e-6]]],
            }
        }
    )
    assert run.pair_ratios(raw, "call_one") == pytest.approx([10.0, 11.0, 40.0])
    (row,) = run.check_guard(raw, {"ratios": {"call_one": 6.0}})
    assert row["status"] == "ok" and row["ratio"] == pytest.approx(11.0)


def test_rates_compare_each_run_with_its_own_amount_of_work(run: Any) -> None:
    raw = _raw({"throughput": {"danaus": [[[0.5]]], "floor": [[[0.1]]]}}, work=5_000)
    raw["throughput"]["floor"][0]["work"] = 50_000  # the floor's longer batches
    assert run.pair_ratios(raw, "throughput") == pytest.approx([(5_000 / 0.5) / (50_000 / 0.1)])


def test_a_failure_is_measured_again_and_passes_if_one_run_does(run: Any) -> None:
    raw = _raw({"call_one": {"danaus": [[[300e-6]]], "floor": [[[10e-6]]]}})  # 30x
    (row,) = run.check_guard(raw, {"ratios": {"call_one": 10.0}})
    assert row["failed"]
    again = iter([250e-6, 150e-6])  # 25x, then 15x: within 20x

    def rerun(wl: str) -> Any:
        return _raw({wl: {"danaus": [[[next(again)]]], "floor": [[[10e-6]]]}})

    run.confirm(row, rerun, tries=3)
    assert not row["failed"] and row["status"] == "ok (run 3)"
    assert row["tries"] == pytest.approx([30.0, 25.0, 15.0])

    (row,) = run.check_guard(raw, {"ratios": {"call_one": 10.0}})
    run.confirm(row, lambda wl: raw, tries=3)  # a regression: every run shows it
    assert row["failed"] and row["status"] == "REGRESSED" and len(row["tries"]) == 3


def test_no_number_fails_no_baseline_and_workloads_not_run_do_not(run: Any) -> None:
    raw = _raw({"spawn": {"danaus": [[[0.1]]], "floor": [[[0.05]]]}})
    raw["call_one"] = {
        "danaus": [{"round": 0, "status": "timeout", "samples": [], "error": "x"}],
        "floor": [{"round": 0, "status": "ok", "samples": [1e-5], "work": None}],
    }
    rows = run.check_guard(raw, {"ratios": {"call_one": 5.0}})
    assert [(r["workload"], r["status"], r["failed"]) for r in rows] == [
        ("spawn", "no baseline", False),
        ("call_one", "NO NUMBER", True),
    ]  # throughput and payload_16MiB were not run: no row


def test_a_recorded_baseline_is_the_worst_round(run: Any, tmp_path: Path) -> None:
    raw = _raw(
        {
            "call_one": {"danaus": [[[80e-6]], [[150e-6]]], "floor": [[[10e-6]], [[10e-6]]]},
            "throughput": {"danaus": [[[0.2]], [[0.5]]], "floor": [[[0.01]], [[0.01]]]},
        },
        work=1000.0,
    )
    path = tmp_path / "baseline.json"
    written = run.write_baseline(path, raw, {"date": "d", "rounds_done": 2})
    assert written == pytest.approx({"call_one": 15.0, "throughput": 0.02})
    doc = json.loads(path.read_text())
    assert doc["ratios"] == written and doc["per_round"]["call_one"] == pytest.approx([8.0, 15.0])
    assert run.load_baseline(path)["ratios"] == written
    assert run.load_baseline(tmp_path / "missing.json") == {}


def test_the_committed_baseline_has_every_guarded_ratio(run: Any) -> None:
    doc = run.load_baseline(run.BASELINE)
    assert set(doc["ratios"]) == set(run.GUARDED)
    assert all(isinstance(v, float) and v > 0 for v in doc["ratios"].values())
