"""Stand-in for ``fire`` where it is not installed: ``Fire(fn)`` calls ``fn()``."""

from __future__ import annotations

from typing import Any


def Fire(component: Any) -> Any:
    return component()
