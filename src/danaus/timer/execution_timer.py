"""Monarch's ``monarch.timer.execution_timer`` module path: the timer and its functions."""

from __future__ import annotations

from .._tensor import timer as _timer
from .._tensor.timer import *  # noqa: F403  (the names of its __all__)

__all__ = _timer.__all__
