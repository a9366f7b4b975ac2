"""danaus: a single-controller framework for distributed machine learning.

One ordinary Python script creates meshes of processes and actors, messages
them with a few verbs, hears at once when any of them fails, and computes
across them. It implements the programming model of PyTorch Monarch in pure
Python: a Monarch program runs with only its imports changed.

Public modules: ``danaus.actor`` (actors, meshes, adverbs, futures, ports,
supervision, several hosts), ``danaus.rdma`` (one-sided bulk transfers),
``danaus.job`` (local and process jobs), and at the top level the mesh shape
algebra (``Shape``, ``Slice``/``NDSlice``, ``Extent``, ``Point``).
"""

from __future__ import annotations

from ._errors import DanausError as DanausError
from ._mesh import Extent as Extent
from ._mesh import NDSlice as NDSlice
from ._mesh import Point as Point
from ._mesh import Shape as Shape
from ._mesh import Slice as Slice
from .config import clear_runtime_config as clear_runtime_config
from .config import configure as configure
from .config import configured as configured
from .config import get_global_config as get_global_config
from .config import get_runtime_config as get_runtime_config

__version__ = "0.1.0"

__all__ = [
    "DanausError",
    "Extent",
    "NDSlice",
    "Point",
    "Shape",
    "Slice",
    "clear_runtime_config",
    "configure",
    "configured",
    "get_global_config",
    "get_runtime_config",
]

for _name in ["DanausError", "Extent", "NDSlice", "Point", "Shape", "Slice"]:
    try:
        globals()[_name].__module__ = __name__
    except (AttributeError, TypeError):
        pass
del _name
