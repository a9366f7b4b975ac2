"""Monarch's ``monarch.common._coalescing``: ``coalescing()``."""

from __future__ import annotations

from .._tensor.coalescing import coalescing

__all__ = ["coalescing"]
