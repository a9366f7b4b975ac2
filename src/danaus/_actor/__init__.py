"""Actor layer: Actor, @endpoint, actor/proc/host meshes, adverbs, futures, context.

Imports: ``_errors``, ``_mesh``, ``_wire``, ``_transport``, ``_runtime``.
"""

from .._runtime import host as _host
from .._runtime import proc as _proc
from . import debugger as _debugger
from . import procservice as _procservice  # noqa: F401  (installs the proc handlers)
from . import undeliverable as _undeliverable

_proc.proc_init_hooks.append(_undeliverable.install)
_proc.proc_init_hooks.append(_debugger.install)

if "danaus.actor" not in _host.PRELOAD:
    _host.PRELOAD.append("danaus.actor")
if "danaus._actor.debugger.remote" not in _host.PRELOAD:  # forked procs get pdb for free
    _host.PRELOAD.append("danaus._actor.debugger.remote")
