"""Monarch's ``monarch.common.selection``: ``Selection``, the routing expressions over a
mesh's dimensions (``Selection.from_string("*, 0:4")``, ``Selection.all()``,
``Selection.any()``). The same class as ``danaus.Selection``; it needs no torch.
"""

from __future__ import annotations

from .._mesh.selection import Selection

__all__ = ["Selection"]
