"""danaus: a single-controller framework for distributed machine learning.

One ordinary Python script creates meshes of processes and actors, messages
them with a few verbs, hears at once when any of them fails, and computes
across them. It implements the programming model of PyTorch Monarch in pure
Python: a Monarch program runs with only its imports changed.

Public modules: ``danaus.actor`` (actors, meshes, adverbs, futures, ports,
supervision, several hosts), ``danaus.supervisor`` (restarts with OTP's
strategies), ``danaus.rdma`` (one-sided bulk transfers), ``danaus.job``
(local, process, SSH and Slurm jobs), ``danaus.spmd`` (torchrun scripts on a
mesh), ``danaus.config`` (every setting), ``danaus.dashboard``,
``danaus.tools.config`` (``Workspace``) and ``danaus.testing``; at the top
level the mesh shape algebra (``Shape``, ``Slice``/``NDSlice``, ``Extent``,
``Point``, ``Selection``), ``stats`` and ``trace``, and the tensor engine (``Tensor``,
``inspect``, ``fetch_shard``, ``reduce``, ``no_mesh``, ``grad_function``, ``OpaqueRef``,
``function_resolvers``, ``set_meta``, the ``builtins`` remote functions ...) and its
``timer`` module. The tensor
engine needs torch and is imported on first use of one of its names, so
``import danaus`` never imports torch.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from . import _boothook
from ._errors import DanausError as DanausError
from ._mesh import Extent as Extent
from ._mesh import NDSlice as NDSlice
from ._mesh import Point as Point
from ._mesh import Selection as Selection
from ._mesh import Shape as Shape
from ._mesh import Slice as Slice
from ._tensor import TOP_LEVEL as _TENSOR_NAMES  # loaded from _tensor.api on first access
from .config import clear_runtime_config as clear_runtime_config
from .config import configure as configure
from .config import configured as configured
from .config import get_global_config as get_global_config
from .config import get_runtime_config as get_runtime_config

__version__ = "0.1.0"


def _load_bootstrap() -> ModuleType:
    """The bootstrap installs every layer on a starting node. It imports them all, so it
    loads when the first node starts, not at ``import danaus``."""
    return importlib.import_module("danaus._bootstrap")


_boothook.register(_load_bootstrap)


# More of Monarch's top-level tensor-engine names: (module, attribute), loaded on first
# access; ``builtins`` is the package ``danaus.builtins`` itself.
_TENSOR_EXTRAS = {
    "OpaqueRef": ("danaus._tensor.opaque_ref", "OpaqueRef"),
    "builtins": ("danaus.builtins", ""),
    "function_resolvers": ("danaus._tensor.function", "resolvers"),
    "set_meta": ("danaus._tensor.simulator", "set_meta"),
    "Simulator": ("danaus._sim.interface", "Simulator"),
}

# Monarch's names for the actor future, loaded from the actor core on first access:
# its ``fetch_shard`` returns ``monarch.actor.Future`` (``ActorFuture`` is its older name).
_FUTURE_NAMES = ("ActorFuture", "Future")

# With the tensor engine's names (_tensor.TOP_LEVEL), written out: the API docs read
# __all__ as strings only.
__all__ = [
    "ActorFuture",
    "DanausError",
    "Extent",
    "Future",
    "NDSlice",
    "OpaqueRef",
    "Point",
    "RemoteProcessGroup",
    "RemoteTensorError",
    "Selection",
    "Shape",
    "Simulator",
    "Slice",
    "Stream",
    "Tensor",
    "builtins",
    "call_on_shard_and_fetch",
    "clear_runtime_config",
    "coalescing",
    "configure",
    "configured",
    "fetch_shard",
    "function_resolvers",
    "get_active_mesh",
    "get_active_stream",
    "get_global_config",
    "get_runtime_config",
    "grad_function",
    "grad_generator",
    "inspect",
    "no_mesh",
    "reduce",
    "reduce_",
    "remote",
    "set_meta",
    "show",
    "slice_mesh",
    "stats",
    "timer",
    "to_mesh",
    "trace",
]


def __getattr__(name: str) -> Any:
    """PEP 562: load the names below on first access, so ``import danaus`` stays fast.

    The tensor engine and ``timer`` (a module) need torch, an optional dependency
    (the ``torch`` extra);
    the observing layer (``trace``, ``stats``, ``dashboard``) imports the actor core;
    ``Future``/``ActorFuture`` (Monarch's top-level names) are the actor core's future;
    ``OpaqueRef``, ``builtins``, ``function_resolvers`` and ``set_meta`` are more of the
    tensor engine's.
    """
    if name in ("dashboard", "timer"):
        value: Any = importlib.import_module(f"danaus.{name}")
    elif name in ("trace", "stats"):
        value = getattr(importlib.import_module("danaus._observe.api"), name)
    elif name in _FUTURE_NAMES:
        value = importlib.import_module("danaus._actor.core.future").Future
    elif name in _TENSOR_NAMES:
        value = getattr(importlib.import_module("danaus._tensor.api"), name)
    elif name in _TENSOR_EXTRAS:
        module, attr = _TENSOR_EXTRAS[name]
        value = importlib.import_module(module)
        if attr:
            value = getattr(value, attr)
    else:
        raise AttributeError(f"module 'danaus' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


for _name in ("DanausError", "Extent", "NDSlice", "Point", "Selection", "Shape", "Slice"):
    try:
        globals()[_name].__module__ = __name__
    except (AttributeError, TypeError):
        pass
del _name
