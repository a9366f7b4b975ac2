"""``danaus.actor``: actors, meshes, adverbs, futures and context — Monarch's ``monarch.actor``.

Example::

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

from ._actor.actor import Actor as Actor
from ._actor.adverbs import Accumulator as Accumulator
from ._actor.adverbs import Endpoint as Endpoint
from ._actor.adverbs import as_endpoint as as_endpoint
from ._actor.adverbs import send as send
from ._actor.context import Context as Context
from ._actor.context import Instance as Instance
from ._actor.context import context as context
from ._actor.context import current_actor_name as current_actor_name
from ._actor.context import current_rank as current_rank
from ._actor.context import current_size as current_size
from ._actor.controller import get_or_spawn_controller as get_or_spawn_controller
from ._actor.debugger import debug_controller as debug_controller
from ._actor.endpoint import concurrent_endpoint as concurrent_endpoint
from ._actor.endpoint import endpoint as endpoint
from ._actor.future import Future as Future
from ._actor.hosts import ChannelTransport as ChannelTransport
from ._actor.hosts import HostMesh as HostMesh
from ._actor.hosts import attach_to_workers as attach_to_workers
from ._actor.hosts import enable_transport as enable_transport
from ._actor.hosts import this_host as this_host
from ._actor.legacy import local_proc_mesh as local_proc_mesh
from ._actor.legacy import proc_mesh as proc_mesh
from ._actor.legacy import sim_proc_mesh as sim_proc_mesh
from ._actor.lifecycle import shutdown_context as shutdown_context
from ._actor.mesh import ActorMesh as ActorMesh
from ._actor.ports import Channel as Channel
from ._actor.ports import Port as Port
from ._actor.ports import PortReceiver as PortReceiver
from ._actor.procs import ProcMesh as ProcMesh
from ._actor.procs import this_proc as this_proc
from ._errors import ActorError as ActorError
from ._errors import SupervisionError as SupervisionError
from ._job.config import hosts_from_config as hosts_from_config
from ._mesh import Extent as Extent
from ._mesh import Point as Point
from ._mesh import ValueMesh as ValueMesh
from ._runtime.worker import run_worker_loop_forever as run_worker_loop_forever
from ._supervision.failure import MeshFailure as MeshFailure
from ._supervision.hook import default_unhandled_fault_hook as unhandled_fault_hook

__all__ = [
    "Accumulator",
    "Actor",
    "ActorError",
    "ActorMesh",
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
    "ProcMesh",
    "SupervisionError",
    "ValueMesh",
    "as_endpoint",
    "attach_to_workers",
    "concurrent_endpoint",
    "context",
    "current_actor_name",
    "current_rank",
    "current_size",
    "debug_controller",
    "enable_transport",
    "endpoint",
    "get_or_spawn_controller",
    "hosts_from_config",
    "local_proc_mesh",
    "proc_mesh",
    "run_worker_loop_forever",
    "send",
    "shutdown_context",
    "sim_proc_mesh",
    "this_host",
    "this_proc",
    "unhandled_fault_hook",
]

for _name in __all__:
    if _name == "unhandled_fault_hook":
        continue  # users replace it by assignment; keep the function's own name
    _obj = globals()[_name]
    if isinstance(_obj, type) or callable(_obj):
        try:
            _obj.__module__ = __name__
        except (AttributeError, TypeError):
            pass
del _name, _obj
