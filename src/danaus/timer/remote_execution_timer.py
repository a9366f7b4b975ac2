"""The timer's functions by the module path Monarch's timer example runs them on workers
with: ``remote("danaus.timer.remote_execution_timer.execution_timer_start",
propagate="inspect")``. Each proc times with its own process's ``ExecutionTimer``."""

from __future__ import annotations

from .._tensor.timer import (
    execution_timer_start,
    execution_timer_stop,
    get_execution_timer_average_ms,
    get_execution_timer_summary,
    get_latest_timer_measurement,
    get_time_perfcounter,
)

__all__ = [
    "execution_timer_start",
    "execution_timer_stop",
    "get_execution_timer_average_ms",
    "get_execution_timer_summary",
    "get_latest_timer_measurement",
    "get_time_perfcounter",
]
