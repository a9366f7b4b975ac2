"""Actor layer: Actor, @endpoint, actor/proc/host meshes, adverbs, futures, context.

Imports: ``_errors``, ``_mesh``, ``_wire``, ``_transport``, ``_runtime``.
"""

from .._runtime import host as _host
from .._runtime import proc as _proc
from . import introspect as _introspect  # noqa: F401  (answers STATS, TRACE_*, STACK)
from . import procservice as _procservice  # noqa: F401  (installs the proc handlers)
from . import undeliverable as _undeliverable

_proc.proc_init_hooks.append(_undeliverable.install)

if "danaus.actor" not in _host.PRELOAD:
    _host.PRELOAD.append("danaus.actor")
