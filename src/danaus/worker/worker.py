"""Monarch's ``monarch.worker.worker``, in part: ``DeviceMesh`` and ``Dim``, a worker's
view of a device mesh (its coordinate and the ranks along each dimension through it)
and the per-stream process groups of its slices. The rest of Monarch's worker process
(its command loop, streams, debugger) has no counterpart: danaus's workers are actors.
"""

from __future__ import annotations

from .._tensor.worker_mesh import DeviceMesh, Dim

__all__ = ["DeviceMesh", "Dim"]
