"""``get_or_spawn_controller``: process-wide singleton actors living in the client.

A hidden registry actor (``_ControllerController``) runs in the client
process under a well-known name; every actor of the job can reach it, so the
same name always yields the same actor mesh. A controller whose actor failed
is remembered: later lookups raise ``ValueError("Failure on <name>: ...")``
(wrapped in ``ActorError``).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, TypeVar

from ..._mesh import Shape
from ..._runtime.node import Node, this_node
from ..core.context import context
from ..core.future import Future
from .actor import Actor
from .endpoint import endpoint
from .mesh import ActorMesh, MeshRef, _State
from .procs import ProcMesh

if TYPE_CHECKING:
    from typing import Protocol

    class _Failure(Protocol):  # what is read of a MeshFailure (_supervision: a layer above)
        mesh_name: str
        reason: str


__all__ = ["get_or_spawn_controller"]

_CC_ID = "controller_controller"

A = TypeVar("A")


class _ControllerController(Actor):
    _danaus_internal = True  # not one of the client's children (``Instance._children``)

    def __init__(self) -> None:
        self.meshes: dict[str, Any] = {}
        self.failures: dict[str, str] = {}

    @endpoint
    def get_or_spawn(self, name: str, cls: Any, args: Any, kwargs: Any) -> Any:
        if name in self.failures:
            raise ValueError(f"Failure on {name}: {self.failures[name]}")
        if name not in self.meshes:
            node = context().actor_instance._home()  # this actor's: the client's node
            here = ProcMesh._singleton(node.runtime.proc_id, node)
            self.meshes[name] = here.spawn(name, cls, *args, **kwargs)
        return self.meshes[name]

    def __supervise__(self, failure: _Failure) -> bool:
        self.failures[failure.mesh_name] = failure.reason
        return True


class _Registry:
    """Whether this client session spawned its registry actor (a part of its node)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # guards spawned (one thread spawns the registry actor)
        self.spawned = False


def ensure_registry(node: Node) -> None:
    """Spawn the registry actor in ``node``'s client, once per session (a no-op in
    spawned procs)."""
    rt = node.runtime
    reg = node.part(_Registry)
    if rt.boot or reg.spawned:
        return
    with reg.lock:
        if not reg.spawned:
            ProcMesh._singleton(rt.proc_id, node)._spawn(
                "controller_controller", _ControllerController, (), {}, _CC_ID
            )
            reg.spawned = True


def _registry(node: Node) -> ActorMesh[Any]:
    ensure_registry(node)
    rt = node.runtime
    client = rt.boot.get("client", rt.proc_id) if rt.boot else rt.proc_id
    ref = MeshRef(_CC_ID, "controller_controller", _ControllerController, (client,), None)
    return ActorMesh(ref, Shape.unity(), _State(node=node))


def get_or_spawn_controller(name: str, Class: type[A], *args: Any, **kwargs: Any) -> Future[A]:
    """The singleton actor mesh called ``name``, spawned in the client on first request.

    Callable from the client and from inside actors; does not block. The same
    ``name`` always yields the same actor (later arguments are ignored).
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"get_or_spawn_controller needs a non-empty string name, got {name!r}")
    # The public face: called from the client or an actor, holding nothing.
    fut: Future[A] = _registry(this_node()).get_or_spawn.call_one(name, Class, args, kwargs)
    return fut
