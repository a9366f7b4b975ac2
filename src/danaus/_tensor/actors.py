"""Distributed tensors as actor endpoint arguments: each actor gets its proc's local shard.

``counter.add.call(t)`` with ``t`` a ``danaus.Tensor``: the endpoint on each
proc of ``t``'s mesh receives that proc's shard, a plain torch tensor (the
shard itself, not a copy). As in Monarch, the call is ordered with the
tensor ops the client issued on ``t``'s stream: the endpoint sees every op
issued before the call, and ops issued after it run only once the endpoint
has returned (so they see what it wrote in place). The actor's other
messages keep their own order; the call waits in the actor's inbox for its
shards. The actor must live on the procs of ``t``'s mesh.

The actor core carries such arguments through ``danaus._actor.handoff``;
this module is the tensor engine's provider: it checks the call and sends
the ``HandOff`` command the workers' streams run.
"""

from __future__ import annotations

from typing import Any

from .._actor.handoff import Recipients
from .active import same_mesh
from .messages import HandOff

__all__ = ["ACTOR_ARGS"]


class _ActorArgs:
    """The provider of distributed tensors passed to actor endpoints."""

    def hand_off(self, key: str, count: int, refs: list[tuple[int, Any]], to: Recipients) -> None:
        """Queue the hand-off of ``refs`` (argument index, tensor) to the actors ``to``.

        Raises ``ValueError`` (before the call is sent) for tensors of
        different meshes or streams, a tensor lent to another stream, or an
        actor on a proc outside the tensors' mesh; ``SupervisionError`` if a
        worker of the mesh has died.
        """
        first = refs[0][1]
        mesh, stream = first._mesh, first._stream
        for _, t in refs:
            if not same_mesh(t._mesh, mesh):
                raise ValueError(
                    f"{to.what}: the distributed tensors passed to one call must be on one mesh; "
                    f"got tensors of {mesh!r} and of {t._mesh!r}. Move one with t.to_mesh(...)"
                )
            if t._stream is not stream:
                raise ValueError(
                    f"{to.what}: the distributed tensors passed to one call must be on one "
                    f"stream; got {stream!r} and {t._stream!r}. Borrow one onto the other's "
                    "stream (stream.borrow(t))"
                )
            if "r" not in t._storage.access:
                dropped = t._storage.dropped
                why = "its borrow was dropped" if dropped else "it is lent mutably to a stream"
                raise ValueError(
                    f"{to.what}: {t!r} cannot be passed to an actor because {why}; "
                    "drop the borrow first"
                )
        engine = first._engine
        engine.check()
        procs = mesh._procs
        worker_of = {procs[g]: g for g in mesh._shape.ranks()}
        ranks = []
        for rank, proc in to.actors:
            g = worker_of.get(proc)
            if g is None:
                raise ValueError(
                    f"{to.what}: a distributed tensor of {mesh!r} was passed to actor rank "
                    f"{rank}, which lives on {proc}, outside that mesh. An actor receives its "
                    "proc's local shard, so it must live on the procs holding the shards: spawn "
                    "it on the tensor's mesh (mesh.spawn(...)), slice the actor mesh to those "
                    "procs, or move the tensor there with t.to_mesh(...)"
                )
            ranks.append((g, rank))
        cmd = HandOff(key, count, tuple((i, t._ref) for i, t in refs), to.mesh_id, tuple(ranks))
        engine.send(mesh._shape, cmd, stream=stream.name)
        engine.flush()  # the actor waits for it: do not leave it to the sender's batching


ACTOR_ARGS = _ActorArgs()
