"""Ownership: which meshes each actor (or the client) in this process spawned.

Every mesh is owned by the actor that spawned it, for life. The owner is told
when its meshes fail (supervision) and stops them when it stops itself. This
registry lives in the owner's process.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from .._wire.ids import ActorId

if TYPE_CHECKING:
    from .mesh import ActorMesh, MeshRef, _State

__all__ = [
    "OwnedMesh",
    "actor_meshes",
    "forget",
    "get",
    "owned_by",
    "register_actor_mesh",
    "register_proc_mesh",
    "stop_owned",
]


class OwnedMesh:
    """An actor mesh spawned from this process, and what its owner knows about it."""

    def __init__(self, mesh: ActorMesh[Any]) -> None:
        self.mesh = mesh
        self.ref: MeshRef = mesh._ref
        self.state: _State = mesh._state

    @property
    def owner(self) -> ActorId | None:
        return self.ref.owner


_lock = threading.Lock()
_actor_meshes: dict[str, OwnedMesh] = {}
_proc_meshes: dict[ActorId, list[Any]] = {}


def register_actor_mesh(mesh: ActorMesh[Any]) -> None:
    with _lock:
        _actor_meshes[mesh._ref.mesh_id] = OwnedMesh(mesh)


def register_proc_mesh(owner: ActorId, pm: Any) -> None:
    with _lock:
        _proc_meshes.setdefault(owner, []).append(pm)


def actor_meshes() -> list[OwnedMesh]:
    with _lock:
        return list(_actor_meshes.values())


def get(mesh_id: str) -> OwnedMesh | None:
    return _actor_meshes.get(mesh_id)


def forget(mesh_id: str) -> None:
    with _lock:
        _actor_meshes.pop(mesh_id, None)


def owned_by(owner: ActorId) -> tuple[list[OwnedMesh], list[Any]]:
    """The actor meshes and proc meshes ``owner`` spawned and has not stopped."""
    with _lock:
        actors = [m for m in _actor_meshes.values() if m.owner == owner and not m.state.stopped]
        procs = [p for p in _proc_meshes.get(owner, []) if not p._state.stopped]
    return actors, procs


def stop_owned(owner: ActorId, reason: str, timeout: float = 10.0) -> None:
    """Stop every mesh ``owner`` owns and wait (bounded) for them: children go first."""
    actors, procs = owned_by(owner)
    futures = [m.mesh.stop(reason) for m in actors] + [p.stop(reason) for p in procs]
    for f in futures:
        try:
            f.get(timeout=timeout)
        except Exception:  # a child that cannot stop cleanly must not block its owner
            pass
