"""``danaus.timer``: Monarch's ``monarch.timer``, an execution timer of named sections.

``ExecutionTimer.time(name)`` times a block with CUDA events when CUDA is
available (the GPU's time), with the CPU's clock otherwise; ``summary()``
gives each section's count, mean, total, min and max in milliseconds. The
functions time on a mesh's workers when run there with ``remote``, the
module path ``danaus.timer.remote_execution_timer`` naming them. Importing
this module imports torch. See ``docs/tensor.md``.
"""

from __future__ import annotations

from .._tensor.timer import (
    ExecutionTimer,
    execution_timer_start,
    execution_timer_stop,
    get_execution_timer_average_ms,
    get_latest_timer_measurement,
)

__all__ = [
    "ExecutionTimer",
    "execution_timer_start",
    "execution_timer_stop",
    "get_execution_timer_average_ms",
    "get_latest_timer_measurement",
]

for _name in __all__:
    globals()[_name].__module__ = __name__
del _name
