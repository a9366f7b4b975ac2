"""Ownership: which meshes each actor (or the client) in this process spawned.

Every mesh is owned by the actor that spawned it, for life. The owner is told
when its meshes fail (supervision) and stops them when it stops itself. This
registry lives in the owner's process, on its node (one per client session).
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Protocol

from ..._mesh import Extent, Shape
from ..._runtime.node import Node
from ..._wire.ids import ActorId
from .meshref import MeshRef, MeshState

__all__ = [
    "OwnedMesh",
    "actor_meshes",
    "forget",
    "forget_on",
    "forget_proc_mesh",
    "get",
    "owned_by",
    "register_actor_mesh",
    "register_proc_mesh",
    "stop_owned",
]

log = logging.getLogger("danaus.actor")


# The actor API's meshes, as this registry (below the API) and its readers use them.


class SpawnedActorMesh(Protocol):
    """What the registry uses of an ``ActorMesh`` (``danaus._actor.api.mesh``)."""

    @property
    def _ref(self) -> MeshRef: ...

    @property
    def _state(self) -> MeshState: ...

    @property
    def _shape(self) -> Shape: ...

    @property
    def extent(self) -> Extent: ...

    def stop(self, reason: str = ...) -> Any: ...


class _Stopped(Protocol):
    @property
    def stopped(self) -> bool: ...


class SpawnedProcMesh(Protocol):
    """What the registry uses of a ``ProcMesh`` (``danaus._actor.api.procs``)."""

    @property
    def _state(self) -> _Stopped: ...

    def stop(self, reason: str = ...) -> Any: ...


class OwnedMesh:
    """An actor mesh spawned from this process, and what its owner knows about it."""

    def __init__(self, mesh: SpawnedActorMesh) -> None:
        self.mesh = mesh
        self.ref: MeshRef = mesh._ref
        self.state: MeshState = mesh._state

    @property
    def owner(self) -> ActorId | None:
        return self.ref.owner


class Registry:
    """The meshes spawned from this process (a part of its node)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # guards actor_meshes and proc_meshes
        self.actor_meshes: dict[str, OwnedMesh] = {}
        self.proc_meshes: dict[ActorId, list[Any]] = {}


def register_actor_mesh(node: Node, mesh: SpawnedActorMesh) -> None:
    r = node.part(Registry)
    with r.lock:
        r.actor_meshes[mesh._ref.mesh_id] = OwnedMesh(mesh)


def register_proc_mesh(node: Node, owner: ActorId, pm: SpawnedProcMesh) -> None:
    r = node.part(Registry)
    with r.lock:
        r.proc_meshes.setdefault(owner, []).append(pm)


def forget_proc_mesh(node: Node, owner: ActorId | None, pm: SpawnedProcMesh) -> None:
    """A proc mesh stopped: its owner no longer holds it."""
    r = node.part(Registry)
    with r.lock:
        for key in [owner] if owner is not None else list(r.proc_meshes):
            held = r.proc_meshes.get(key, [])
            if pm in held:
                held.remove(pm)
            if not held:
                r.proc_meshes.pop(key, None)


def actor_meshes(node: Node) -> list[OwnedMesh]:
    r = node.part(Registry)
    with r.lock:
        return list(r.actor_meshes.values())


def get(node: Node, mesh_id: str) -> OwnedMesh | None:
    return node.part(Registry).actor_meshes.get(mesh_id)


def forget(node: Node, mesh_id: str) -> None:
    r = node.part(Registry)
    with r.lock:
        r.actor_meshes.pop(mesh_id, None)


def forget_on(node: Node, proc_names: set[str]) -> None:
    """Procs stopped: forget every actor mesh that lived on them only."""
    r = node.part(Registry)
    with r.lock:
        gone = [
            mid
            for mid, m in r.actor_meshes.items()
            if all(p.name in proc_names for p in m.ref.procs)
        ]
        for mid in gone:
            del r.actor_meshes[mid]


def owned_by(node: Node, owner: ActorId) -> tuple[list[OwnedMesh], list[Any]]:
    """The actor meshes and proc meshes ``owner`` spawned and has not stopped."""
    r = node.part(Registry)
    with r.lock:
        actors = [m for m in r.actor_meshes.values() if m.owner == owner and not m.state.stopped]
        procs = [p for p in r.proc_meshes.get(owner, []) if not p._state.stopped]
    return actors, procs


def stop_owned(node: Node, owner: ActorId, reason: str, timeout: float = 10.0) -> None:
    """Stop every mesh ``owner`` owns and wait (bounded) for them: children go first."""
    actors, procs = owned_by(node, owner)
    stopping = [(m.mesh, m.mesh.stop(reason)) for m in actors] + [
        (p, p.stop(reason)) for p in procs
    ]
    for child, f in stopping:
        try:
            f.get(timeout=timeout)
        except Exception as e:  # a child that cannot stop cleanly must not block its owner
            log.warning("%s stopped, but its %r did not stop cleanly: %r", owner, child, e)
