"""danaus.timer: Monarch's ExecutionTimer in this process (on a mesh's workers:
tests/tensor/test_timer.py).

No test compares a time with a threshold: they check counts, which section a
measurement went to, nesting (an enclosing section never measures less than the
one it encloses), reset, the summary's keys, and that CUDA timings come from the
events, read only when asked for.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import danaus  # noqa: E402
from danaus.timer import ExecutionTimer  # noqa: E402

pytestmark = pytest.mark.torch

KEYS = {"count", "mean_ms", "total_ms", "min_ms", "max_ms"}


@pytest.fixture
def timer() -> Iterator[ExecutionTimer]:
    """The process's timer, empty, as Monarch's tests use it (on the class)."""
    ExecutionTimer.reset()
    yield ExecutionTimer.default()
    ExecutionTimer.reset()


def test_nested_sections_are_measured_by_name(timer: ExecutionTimer) -> None:
    with ExecutionTimer.time("outer", use_cpu=True):
        for _ in range(3):
            with ExecutionTimer.time("inner", use_cpu=True):
                pass
    stats = ExecutionTimer.summary()
    assert set(stats) == {"outer", "inner"}
    assert stats["outer"]["count"] == 1
    assert stats["inner"]["count"] == 3
    for s in stats.values():
        assert set(s) == KEYS
        assert s["min_ms"] <= s["mean_ms"] <= s["max_ms"]
        assert s["total_ms"] == pytest.approx(s["mean_ms"] * s["count"])
    assert stats["outer"]["total_ms"] >= stats["inner"]["total_ms"]  # it encloses them


def test_a_name_started_twice_stops_latest_first(timer: ExecutionTimer) -> None:
    ExecutionTimer.start("s", use_cpu=True)
    ExecutionTimer.start("s", use_cpu=True)
    ExecutionTimer.stop("s", use_cpu=True)  # the inner one
    inner = ExecutionTimer.get_latest_measurement("s")
    ExecutionTimer.stop("s", use_cpu=True)  # the outer one
    outer = ExecutionTimer.get_latest_measurement("s")
    assert ExecutionTimer.summary()["s"]["count"] == 2
    assert outer >= inner
    with pytest.raises(RuntimeError, match="no section 's' is running"):
        ExecutionTimer.stop("s")


def test_stop_without_start_is_a_clear_error(timer: ExecutionTimer) -> None:
    ExecutionTimer.start("other", use_cpu=True)
    with pytest.raises(RuntimeError, match=r"stop\('never'\).*start\('never'\).*'other'"):
        ExecutionTimer.stop("never")
    ExecutionTimer.stop("other")
    with pytest.raises(TypeError, match="must be a string"):
        ExecutionTimer.start(3)  # type: ignore[arg-type]


def test_the_default_name_and_the_module_functions_use_the_process_timer(
    timer: ExecutionTimer,
) -> None:
    from danaus.timer import execution_timer as et

    et.execution_timer_start(use_cpu=True)
    et.execution_timer_stop(use_cpu=True)
    with ExecutionTimer.time():
        pass
    assert et.get_execution_timer_summary()["default"]["count"] == 2
    latest = et.get_latest_timer_measurement()
    average = et.get_execution_timer_average_ms()
    assert latest.dtype == average.dtype == torch.float64
    assert latest.item() == timer.get_latest_measurement("default")
    assert average.item() == pytest.approx(timer.summary()["default"]["mean_ms"])
    assert et.get_time_perfcounter().dtype == torch.float64


def test_reset_forgets_measurements_but_not_running_sections(timer: ExecutionTimer) -> None:
    with ExecutionTimer.time("before", use_cpu=True):
        pass
    ExecutionTimer.start("running", use_cpu=True)
    ExecutionTimer.reset()
    assert ExecutionTimer.summary() == {}
    ExecutionTimer.stop("running")
    assert list(ExecutionTimer.summary()) == ["running"]


def test_missing_sections(timer: ExecutionTimer) -> None:
    assert ExecutionTimer.get_latest_measurement("nothing") == 0.0  # as Monarch's
    with pytest.raises(KeyError, match="no measurement of section 'nothing'"):
        danaus.timer.get_execution_timer_average_ms("nothing")


def test_an_instance_is_a_timer_of_its_own(timer: ExecutionTimer) -> None:
    mine = ExecutionTimer()
    with mine.time("mine", use_cpu=True):
        pass
    mine.start("open", use_cpu=True)
    assert list(mine.summary()) == ["mine"]
    assert ExecutionTimer.summary() == {}
    with pytest.raises(RuntimeError, match="no section 'open'"):
        ExecutionTimer.stop("open")  # the process's timer has no such section
    mine.stop("open")
    mine.reset()
    assert mine.summary() == {}


def test_print_summary_prints_a_line_per_section(
    timer: ExecutionTimer, capsys: pytest.CaptureFixture[str]
) -> None:
    ExecutionTimer.print_summary()
    assert "no measurements" in capsys.readouterr().out
    for name in ("load", "step"):
        with ExecutionTimer.time(name, use_cpu=True):
            pass
    ExecutionTimer.print_summary()
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["section", "count", "mean"]
    assert sorted(line.split()[0] for line in lines[1:]) == ["load", "step"]


class _FakeEvent:
    """A CUDA event whose elapsed time is fixed, recording what the timer did with it."""

    made: list[_FakeEvent] = []

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing
        self.recorded_on: Any = None
        self.synchronized = False
        self.done = False  # whether the GPU has run it (``query()``)
        _FakeEvent.made.append(self)

    def query(self) -> bool:
        return self.done

    def record(self, stream: Any) -> None:
        self.recorded_on = stream

    def synchronize(self) -> None:
        self.synchronized = True

    def elapsed_time(self, end: _FakeEvent) -> float:
        assert end.synchronized, "read before the end event completed"
        return 15.0


def test_with_cuda_the_time_comes_from_events_read_only_when_asked(
    timer: ExecutionTimer, monkeypatch: pytest.MonkeyPatch
) -> None:
    stream = object()
    _FakeEvent.made = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: stream)
    with ExecutionTimer.time("gpu"):
        pass
    with ExecutionTimer.time("host", use_cpu=True):
        pass
    start, end = _FakeEvent.made
    assert start.recorded_on is stream and end.recorded_on is stream
    assert not end.synchronized  # stop() does not wait for the GPU
    assert ExecutionTimer.get_latest_measurement("gpu") == 15.0
    assert end.synchronized
    stats = ExecutionTimer.summary()
    assert stats["gpu"] == {
        "count": 1,
        "mean_ms": 15.0,
        "total_ms": 15.0,
        "min_ms": 15.0,
        "max_ms": 15.0,
    }
    assert stats["host"]["count"] == 1
    assert len(_FakeEvent.made) == 2  # the CPU section made no events


def test_stopping_a_cuda_section_reads_the_earlier_ones_the_gpu_has_run(
    timer: ExecutionTimer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loop that times every step and never asks keeps only the events still running."""
    _FakeEvent.made = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: object())
    for _ in range(3):
        with ExecutionTimer.time("step"):
            pass
    ends = _FakeEvent.made[1::2]
    assert not any(e.synchronized for e in ends)  # none has run: none read
    ends[0].done = ends[1].done = True
    with ExecutionTimer.time("step"):
        pass
    assert [e.synchronized for e in ends] == [True, True, False]  # read as they ran
    assert ExecutionTimer.summary()["step"]["count"] == 4


def test_danaus_timer_is_monarchs_module() -> None:
    import danaus.timer.remote_execution_timer as remote_timer

    assert danaus.timer.ExecutionTimer is ExecutionTimer
    assert remote_timer.execution_timer_start is danaus.timer.execution_timer_start
    assert ExecutionTimer.__module__ == "danaus.timer"
