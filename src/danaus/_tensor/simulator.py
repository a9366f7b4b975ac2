"""``set_meta``: Monarch's label for the simulator's tasks, kept on a stack here.

Monarch's simulator records each task the client issues, tagged with the
innermost ``set_meta`` value. danaus has no simulator: ``with set_meta(v):``
still pushes ``v`` for the block (``meta_stack()`` reads this thread's stack,
outermost first), and the first use in a process says, with a
``NoEffectWarning``, that it changes nothing.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Iterator
from typing import Any

from .._config import NoEffectWarning

__all__ = ["meta_stack", "set_meta"]

_local = threading.local()
_warned = [False]
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

    Blocks nest; the innermost value is ``meta_stack()[-1]``. danaus has no
    simulator, so the label has no effect; the first use in a process warns
    so with ``danaus.config.NoEffectWarning``. Never blocks.
    """
    with _warn_lock:
        first, _warned[0] = not _warned[0], True
    if first:
        warnings.warn(
            "set_meta() labels the tasks of Monarch's simulator, which danaus does not have: "
            "it has no effect (the values are kept on a stack, nothing reads them)",
            NoEffectWarning,
            stacklevel=3,
        )
    stack = _stack()
    stack.append(new_value)
    try:
        yield
    finally:
        stack.pop()
