"""Monarch's ``monarch.timer.execution_timer`` module path: the timer and its functions."""

from __future__ import annotations

from .._tensor.timer import (
    ExecutionTimer,
    execution_timer_start,
    execution_timer_stop,
    get_execution_timer_average_ms,
    get_execution_timer_summary,
    get_latest_timer_measurement,
    get_time_perfcounter,
)

__all__ = [
    "ExecutionTimer",
    "execution_timer_start",
    "execution_timer_stop",
    "get_execution_timer_average_ms",
    "get_execution_timer_summary",
    "get_latest_timer_measurement",
    "get_time_perfcounter",
]
