"""``endpoint.rref(...)``: an actor endpoint whose results stay on the mesh as tensors.

The call goes as an endpoint call with distributed tensor arguments does
(``actors``), and back: the endpoint's return value on each proc becomes
that proc's shard of new mesh tensors, whose shapes the endpoint's
``propagate`` function gives on the client (so ``rref`` returns at once, as
Monarch's does).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils import _pytree as pytree

from .._actor.core.handoff import Recipients
from .actors import check_tensors, worker_ranks
from .client import active_mesh
from .engine import engine_for
from .messages import HandOff
from .remote import new_handles, run_propagate
from .stream import check_use, get_active_stream
from .tensor import Tensor

__all__ = ["actor_rref"]


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
    check_tensors(what, handles, mesh, stream)
    actors = tuple((r, p) for _, r, p in endpoint._targets())
    ranks = worker_ranks(mesh, Recipients(endpoint._route.ref.mesh_id, what, actors))
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
