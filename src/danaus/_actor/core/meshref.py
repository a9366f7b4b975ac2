"""What identifies an actor mesh anywhere (``MeshRef``, which travels when the mesh is
pickled) and the state a mesh shares with its slices in the process that holds it
(``MeshState``): plain records, below the actor API that makes meshes of them, so the
registry of owned meshes (``owned``) reads them without importing the API.
"""

from __future__ import annotations

import concurrent.futures
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..._wire.ids import ActorId, ProcId

if TYPE_CHECKING:
    from ..._runtime.node import Node

__all__ = ["MeshRef", "MeshState"]


@dataclass(frozen=True)
class MeshRef:
    """What identifies an actor mesh anywhere: it travels when the mesh is pickled."""

    mesh_id: str
    name: str
    cls: type
    procs: tuple[ProcId, ...]  # by rank in the whole mesh
    owner: ActorId | None


@dataclass
class MeshState:
    """Client-side state shared by a mesh and its slices (not pickled)."""

    initialized: concurrent.futures.Future[Any] | None = None
    stopped: bool = False
    failed: dict[int, str] = field(default_factory=dict)  # rank -> why (owner's view)
    tracebacks: dict[int, str] = field(default_factory=dict)  # rank -> remote traceback
    lock: threading.Lock = field(default_factory=threading.Lock)
    booted: bool = False  # every proc of the mesh has booted (checked before a tree cast)
    node: Node | None = None  # the node the mesh belongs to (None: this process's, on use)
    tree: bool | None = None  # messaged through its cast tree (decided once, on first use)
