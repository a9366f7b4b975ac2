"""``set_meta``: Monarch's label for the simulator's tasks, kept on a stack here.

The simulator (``danaus.simulator``) tags each task the client issues with
the innermost ``set_meta`` value (``meta_stack()[-1]``; it shows in the
trace). Outside a simulation ``with set_meta(v):`` still pushes ``v`` for the
block, and the first such use in a process says, with a ``NoEffectWarning``,
that it changes nothing there.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Iterator
from typing import Any

from .._config import NoEffectWarning

__all__ = ["meta_stack", "read_by_tasks", "set_meta", "simulating"]

_local = threading.local()
_simulations = [0]  # simulated meshes alive (danaus._sim sets it: this layer cannot see it)


def simulating(on: bool) -> None:
    """A simulated mesh started (``True``) or exited (``False``): ``set_meta`` has an effect."""
    with _warn_lock:
        _simulations[0] = max(0, _simulations[0] + (1 if on else -1))


def read_by_tasks() -> None:
    """The task-queue workers (``danaus.simulator.task``) are loaded: every ``Task`` made
    carries the labels, so ``set_meta`` has an effect without a simulated mesh."""
    with _warn_lock:
        _task_queue[0] = True


_warned = [False]
_task_queue = [False]
_warn_lock = threading.Lock()


def _stack() -> list[Any]:
    stack: list[Any] | None = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


def meta_stack() -> tuple[Any, ...]:
    """This thread's ``set_meta`` values, outermost first (empty outside any block)."""
    return tuple(_stack())


@contextlib.contextmanager
def set_meta(new_value: Any) -> Iterator[None]:
    """Label what the block issues with ``new_value`` (Monarch's simulator metadata).

    Blocks nest; the innermost value is ``meta_stack()[-1]``, which a simulated
    mesh's tasks carry into the trace, as do the tasks of the task-queue workers
    (``danaus.simulator.task``). With no simulation running and no task queue
    loaded the label has no effect; the first such use in a process warns so with
    ``danaus.config.NoEffectWarning``. Never blocks.
    """
    with _warn_lock:
        first = not _warned[0] and not _simulations[0] and not _task_queue[0]
        if first:
            _warned[0] = True
    if first:
        warnings.warn(
            "set_meta() labels the tasks of the simulator (danaus.Simulator), and none is "
            "running: it has no effect here",
            NoEffectWarning,
            stacklevel=3,
        )
    stack = _stack()
    stack.append(new_value)
    try:
        yield
    finally:
        stack.pop()
