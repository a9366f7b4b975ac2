"""Monarch's ``monarch.common.device_mesh``: the active mesh of the tensor engine.

In danaus a ``ProcMesh`` is the tensor engine's mesh (``with procs.activate():``),
so there is no separate ``DeviceMesh`` class; ``procs.process_group(dims)``
makes its ``RemoteProcessGroup``.
"""

from __future__ import annotations

from .._tensor.active import get_active_mesh, no_mesh
from .._tensor.groups import RemoteProcessGroup

__all__ = ["RemoteProcessGroup", "get_active_mesh", "no_mesh"]
