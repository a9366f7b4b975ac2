"""``danaus.actor``: actors, meshes, adverbs, futures and context — Monarch's ``monarch.actor``.

Example:

    from danaus.actor import Actor, endpoint, this_host

    class Counter(Actor):
        def __init__(self, start: int):
            self.n = start

        @endpoint
        def incr(self) -> int:
            self.n += 1
            return self.n

    procs = this_host().spawn_procs(per_host={"gpus": 2})
    counters = procs.spawn("counters", Counter, 0)
    print(counters.incr.call().get())
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .._actor.api.actor import Actor
from .._actor.api.adverbs import Accumulator, Endpoint, as_endpoint, send
from .._actor.api.bootcmd import BootstrapCommand, default_bootstrap_cmd
from .._actor.api.controller import get_or_spawn_controller
from .._actor.api.endpoint import concurrent_endpoint, endpoint
from .._actor.api.hosts import HostMesh, this_host
from .._actor.api.joining import ChannelTransport, attach, attach_to_workers, enable_transport
from .._actor.api.legacy import local_proc_mesh, proc_mesh, sim_proc_mesh
from .._actor.api.lifecycle import shutdown_context
from .._actor.api.mesh import ActorMesh
from .._actor.api.procs import ProcMesh, this_proc
from .._actor.core import config as config
from .._actor.core.context import (
    Context,
    Instance,
    context,
    current_actor_name,
    current_rank,
    current_size,
)
from .._actor.core.future import Future
from .._actor.core.ports import Channel, Port, PortReceiver
from .._actor.core.telemetry import get_meter, span, traced
from .._errors import ActorError as ActorError
from .._errors import SupervisionError as SupervisionError
from .._job.config import hosts_from_config as hosts_from_config
from .._mesh import Extent as Extent
from .._mesh import Point as Point
from .._mesh import ValueMesh as ValueMesh
from .._runtime.hosting.worker import run_worker_loop_forever
from .._supervision.failure import MeshFailure as MeshFailure
from .._supervision.hook import default_unhandled_fault_hook as unhandled_fault_hook
from .._wire.ids import ProcId, Uid

if TYPE_CHECKING:
    from .._actor.debugger.controller import debug_controller as debug_controller

__all__ = [
    "Accumulator",
    "Actor",
    "ActorError",
    "ActorMesh",
    "BootstrapCommand",
    "Channel",
    "ChannelTransport",
    "Context",
    "Endpoint",
    "Extent",
    "Future",
    "HostMesh",
    "Instance",
    "MeshFailure",
    "Point",
    "Port",
    "PortReceiver",
    "ProcId",
    "ProcMesh",
    "SupervisionError",
    "Uid",
    "ValueMesh",
    "as_endpoint",
    "attach",
    "attach_to_workers",
    "concurrent_endpoint",
    "config",
    "context",
    "current_actor_name",
    "current_rank",
    "current_size",
    "debug_controller",
    "default_bootstrap_cmd",
    "enable_transport",
    "endpoint",
    "get_meter",
    "get_or_spawn_controller",
    "hosts_from_config",
    "local_proc_mesh",
    "proc_mesh",
    "run_worker_loop_forever",
    "send",
    "shutdown_context",
    "sim_proc_mesh",
    "span",
    "this_host",
    "this_proc",
    "traced",
    "unhandled_fault_hook",
]

for _name in __all__:
    if _name == "unhandled_fault_hook":
        continue  # users replace it by assignment; keep the function's own name
    if _name in ("ProcId", "Uid"):
        continue  # wire ids: pickles keep naming the module that defines them
    if _name == "debug_controller":
        continue  # loaded on first use (__getattr__ below)
    _obj = globals()[_name]
    if isinstance(_obj, type) or callable(_obj):
        try:
            _obj.__module__ = __name__
        except (AttributeError, TypeError):
            pass
del _name, _obj

if not TYPE_CHECKING:  # the type checker sees the import above instead

    def __getattr__(name: str) -> Any:
        if name == "debug_controller":
            # The debugger (its controller, prompt and commands: ~15 ms of imports) loads
            # on first use, so a client that never debugs never imports it.
            mod = importlib.import_module("danaus._actor.debugger.controller")
            value = mod.debug_controller
            value.__module__ = __name__
            globals()[name] = value
            return value
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
