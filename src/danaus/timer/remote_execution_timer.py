"""The timer's functions by the module path Monarch's timer example runs them on workers
with: ``remote("danaus.timer.remote_execution_timer.execution_timer_start",
propagate="inspect")``. Each proc times with its own process's ``ExecutionTimer``."""

from __future__ import annotations

from .._tensor import timer as _timer
from .._tensor.timer import *  # noqa: F403  (the names of its __all__)

__all__ = [name for name in _timer.__all__ if name != "ExecutionTimer"]  # the functions
