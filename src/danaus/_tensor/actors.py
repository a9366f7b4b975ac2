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

``endpoint.rref(...)`` (:func:`actor_rref`) goes the same way and back: the
endpoint's return value on each proc becomes that proc's shard of new mesh
tensors, whose shapes the endpoint's ``propagate`` function gives on the
client (so ``rref`` returns at once, as Monarch's does).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch.utils import _pytree as pytree

from .._actor.core.handoff import Recipients
from .active import active_mesh, same_mesh
from .engine import engine_for
from .messages import HandOff
from .remote import new_handles, run_propagate
from .stream import Stream, check_use, get_active_stream
from .tensor import Tensor

if TYPE_CHECKING:
    from .._actor.api.procs import ProcMesh

__all__ = ["ACTOR_ARGS", "actor_rref"]


def _check_tensors(what: str, tensors: list[Any], mesh: ProcMesh, stream: Stream) -> None:
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


def _worker_ranks(mesh: ProcMesh, to: Recipients) -> list[tuple[int, int]]:
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
        _check_tensors(to.what, [t for _, t in refs], mesh, stream)
        engine = first._engine
        engine.check()
        ranks = _worker_ranks(mesh, to)
        cmd = HandOff(key, count, tuple((i, t._ref) for i, t in refs), to.mesh_id, tuple(ranks))
        engine.send(mesh._shape, cmd, stream=stream.name)
        engine.flush()  # the actor waits for it: do not leave it to the sender's batching


ACTOR_ARGS = _ActorArgs()


def actor_rref(endpoint: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``endpoint.rref(*args, **kwargs)``: see ``Endpoint.rref``. Never blocks.

    The mesh is that of the distributed tensors among the arguments (as in
    Monarch, an active mesh is not needed then), else the active mesh; the
    stream is the active one. Raises before sending: ``ValueError`` without a
    mesh, for a local tensor, tensors of another mesh or stream, or actors that
    are not one per proc of the mesh; ``NotImplementedError`` for an endpoint
    without a ``propagate`` function (``"inspect"`` means no tensor results:
    ``rref`` then returns ``None``, as Monarch's); what ``propagate`` raises.
    """
    what = f"{endpoint._what}.rref"  # "linear.forward().rref"
    flat, spec = pytree.tree_flatten((args, kwargs))
    handles = [x for x in flat if isinstance(x, Tensor)]
    mesh = handles[0]._mesh if handles else active_mesh()
    if mesh is None:
        raise ValueError(
            f"{what}: no mesh to put the results on: pass distributed tensors or call it "
            "under `with procs.activate():`"
        )
    local = next(
        (x for x in flat if isinstance(x, torch.Tensor) and not isinstance(x, Tensor)), None
    )
    if local is not None:
        raise ValueError(
            f"{what}: a local tensor of shape {list(local.shape)} was passed; an actor "
            "receives its proc's shard of distributed tensors only (create it under the mesh)"
        )
    stream = get_active_stream()
    check_use(what, handles, (), stream)
    _check_tensors(what, handles, mesh, stream)
    actors = tuple((r, p) for _, r, p in endpoint._targets())
    ranks = _worker_ranks(mesh, Recipients(endpoint._mesh._ref.mesh_id, what, actors))
    workers = sorted(g for g, _ in ranks)
    if workers != sorted(mesh._shape.ranks()):
        raise ValueError(
            f"{what}: every proc of {mesh!r} needs one actor of the mesh called, to "
            f"compute its shard of the result; the actors called live on "
            f"{len(set(workers))} of its {len(list(mesh._shape.ranks()))} procs"
            + (" (some on the same proc)" if len(set(workers)) != len(workers) else "")
            + ". Spawn the actors on that mesh (procs.spawn(...)) and call them all"
        )
    out_flat, out_spec = _propagate(what, endpoint._prop.propagate, flat, spec)
    engine = engine_for(mesh)
    engine.check()
    device = handles[0].device if handles else engine.device
    results, outs = new_handles(out_flat, mesh, engine, device, stream)

    def hand_off(key: str, count: int, refs: list[tuple[int, Any]], to: Recipients) -> None:
        cmd = HandOff(
            key,
            count,
            tuple((i, t._ref) for i, t in refs),
            to.mesh_id,
            tuple(ranks),
            tuple(outs),
            endpoint._what,
        )
        engine.send(mesh._shape, cmd, stream=stream.name)
        engine.flush()  # the actors wait for it: do not leave it to the sender's batching

    endpoint._send_returning(args, kwargs, hand_off)
    return pytree.tree_unflatten(results, out_spec)


def _propagate(what: str, propagate: Any, flat: list[Any], spec: Any) -> tuple[list[Any], Any]:
    """What ``propagate`` says the endpoint returns (flattened, its tensors as meta
    tensors, and its structure), run on meta tensors on the client."""
    if propagate is None or propagate == "cached":
        raise NotImplementedError(
            f"{what}: cached propagation is not implemented for actor endpoints (as in "
            "Monarch); declare the results' shapes with @endpoint(propagate=fn), fn taking "
            "meta tensors and returning what the endpoint returns (e.g. lambda x: x)"
        )
    if propagate == "mocked":
        raise NotImplementedError(f"{what}: mocked propagation is not implemented (as in Monarch)")
    if propagate == "inspect":
        return pytree.tree_flatten(None)
    out_flat, out_spec, _ = run_propagate(propagate, flat, spec)
    return out_flat, out_spec
