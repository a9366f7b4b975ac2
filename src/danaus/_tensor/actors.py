"""Distributed tensors as actor endpoint arguments: each actor gets its proc's local shard.

``counter.add.call(t)`` with ``t`` a ``danaus.Tensor``: the endpoint on each
proc of ``t``'s mesh receives that proc's shard, a plain torch tensor (the
shard itself, not a copy). As in Monarch, the call is ordered with the
tensor ops the client issued on ``t``'s stream: the endpoint sees every op
issued before the call, and ops issued after it run only once the endpoint
has returned (so they see what it wrote in place). The actor's other
messages keep their own order; the call waits in the actor's inbox for its
shards. The actor must live on the procs of ``t``'s mesh.

The actor core carries such arguments through ``danaus._actor.core.handoff``;
this module is the tensor engine's provider: it checks the call and sends
the ``HandOff`` command the workers' streams run.

``endpoint.rref(...)`` goes the same way and back (``rref``). The checks
here are shared with it; this module sits below ``tensor`` (whose pickling
hands a tensor to ``ACTOR_ARGS``), so it knows tensors by their attributes only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._actor.core.handoff import Recipients
from .client import same_mesh
from .messages import HandOff
from .stream import Stream

if TYPE_CHECKING:
    from .._actor.api.procs import ProcMesh

__all__ = ["ACTOR_ARGS", "check_tensors", "worker_ranks"]


def check_tensors(what: str, tensors: list[Any], mesh: ProcMesh, stream: Stream) -> None:
    """Raise ``ValueError`` unless every tensor is of ``mesh`` and ``stream``, and readable."""
    for t in tensors:
        if not same_mesh(t._mesh, mesh):
            raise ValueError(
                f"{what}: the distributed tensors passed to one call must be on one mesh; "
                f"got tensors of {mesh!r} and of {t._mesh!r}. Move one with t.to_mesh(...)"
            )
        if t._stream is not stream:
            raise ValueError(
                f"{what}: the distributed tensors passed to one call must be on one "
                f"stream; got {stream!r} and {t._stream!r}. Borrow one onto the other's "
                "stream (stream.borrow(t))"
            )
        if "r" not in t._storage.access:
            dropped = t._storage.dropped
            why = "its borrow was dropped" if dropped else "it is lent mutably to a stream"
            raise ValueError(
                f"{what}: {t!r} cannot be passed to an actor because {why}; drop the borrow first"
            )


def worker_ranks(mesh: ProcMesh, to: Recipients) -> list[tuple[int, int]]:
    """``(worker rank, actor rank)`` for each actor of ``to``; ``ValueError`` for an actor on
    a proc outside ``mesh``."""
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
    return ranks


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
        check_tensors(to.what, [t for _, t in refs], mesh, stream)
        engine = first._engine
        engine.check()
        ranks = worker_ranks(mesh, to)
        cmd = HandOff(key, count, tuple((i, t._ref) for i, t in refs), to.mesh_id, tuple(ranks))
        engine.send(mesh._shape, cmd, stream=stream.name)
        engine.flush()  # the actor waits for it: do not leave it to the sender's batching


ACTOR_ARGS = _ActorArgs()
