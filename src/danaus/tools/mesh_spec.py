"""``danaus.tools.mesh_spec``: Monarch's ``MeshSpec`` and ``ServerSpec`` (what
``danaus.tools.commands.info`` returns), with TorchX's ``AppState`` values."""

from __future__ import annotations

from .._job.servers import DEFAULT_REMOTE_ALLOCATOR_PORT as DEFAULT_REMOTE_ALLOCATOR_PORT
from .._job.servers import AppState, MeshSpec, ServerSpec

__all__ = ["DEFAULT_REMOTE_ALLOCATOR_PORT", "AppState", "MeshSpec", "ServerSpec"]

for _cls in (AppState, MeshSpec, ServerSpec):
    _cls.__module__ = __name__
del _cls
