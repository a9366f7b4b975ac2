"""Actor layer: Actor, @endpoint, actor/proc/host meshes, adverbs, futures, context.

Imports: ``_errors``, ``_mesh``, ``_wire``, ``_transport``, ``_runtime``.
"""

from .._runtime import host as _host
from . import procservice as _procservice  # noqa: F401  (installs the proc handlers)

if "danaus.actor" not in _host.PRELOAD:
    _host.PRELOAD.append("danaus.actor")
