"""``TensorWorker``: the actor on each proc that holds that proc's shards and runs commands.

Commands arrive in the order the client issued them (per-sender FIFO), in
batches tagged with the stream they were issued on; the actor's thread
hands each batch to that stream's thread (``worker_streams``), which runs
its commands one at a time, so different streams run at the same time and
meet only at the ``Signal``/``Wait`` points of borrows. A failing command
never raises: its outputs (and anything it wrote in place) are recorded as
a ``Failure``, which every command reading them passes on unchanged, so the
error follows the data and the worker lives on.
"""

from __future__ import annotations

import datetime
import logging
import os
import pickle
import sys
import traceback
from typing import Any

import torch
import torch.distributed as dist
from torch.utils import _pytree as pytree

from .._actor.api.actor import Actor
from .._actor.api.endpoint import endpoint
from .._actor.core import handoff
from .._actor.core.context import context, current_rank
from . import gpu_timing
from . import worker_collectives as collectives
from .backends import StagedGroup, new_group
from .errors import Failure, RemoteTensorError
from .function import resolve_function, target_name
from .messages import (
    BorrowCreate,
    BorrowDrop,
    CallOp,
    Delete,
    GroupArg,
    HandOff,
    MeshRank,
    Reduce,
    ReduceMany,
    Ref,
    RunRemote,
    SendTo,
    Signal,
    Wait,
)
from .opaque_ref import OpaqueRef, mark_worker
from .rendezvous import actor_store
from .worker_streams import Streams, current_stream

__all__ = ["TensorWorker", "register_group_ranks", "resolve_op", "unregister_group_ranks"]

log = logging.getLogger("danaus.tensor")

_OPS: dict[str, Any] = {}  # a per-process cache, not state: op name -> torch.ops callable


def _pick_device(kind: str, rank: int) -> torch.device:
    """``"cpu"``, or ``"cuda"``: this proc's GPU (its rank modulo the GPUs it sees)."""
    if kind == "cuda":
        n = torch.cuda.device_count()
        if n == 0:
            raise RuntimeError(
                "the tensor engine was asked for CUDA (tensor_device='cuda') but this proc sees "
                "no GPU; set DANAUS_TENSOR_DEVICE=cpu or auto"
            )
        return torch.device("cuda", rank % n)
    return torch.device("cpu")


def resolve_op(name: str) -> Any:
    """``"aten::add.Tensor"`` -> ``torch.ops.aten.add.Tensor`` (cached)."""
    op = _OPS.get(name)
    if op is None:
        ns, rest = name.split("::", 1)
        base, _, overload = rest.partition(".")
        op = getattr(getattr(getattr(torch.ops, ns), base), overload or "default")
        _OPS[name] = op
    return op


class _Failed(Exception):
    def __init__(self, failure: Failure):
        self.failure = failure


def register_group_ranks(pg: Any, ranks: tuple[int, ...]) -> None:
    """Tell torch.distributed the global ranks of ``pg``'s members (the procs' ranks in
    the spawned mesh), so ``broadcast(t, src=global_rank, group=pg)`` and
    ``get_process_group_ranks(pg)`` work as in Monarch. Best effort: torch's own table."""
    table = getattr(getattr(dist.distributed_c10d, "_world", None), "pg_group_ranks", None)
    if isinstance(table, dict):
        table[pg] = {g: i for i, g in enumerate(ranks)}


def unregister_group_ranks(pg: Any) -> None:
    table = getattr(getattr(dist.distributed_c10d, "_world", None), "pg_group_ranks", None)
    if isinstance(table, dict):
        table.pop(pg, None)


class TensorWorker(Actor):
    """Holds this proc's shards (``id -> tensor | Failure``) and its process groups."""

    def __init__(
        self,
        store: Any,
        timeout_s: float,
        device: str = "cpu",
        threads: int = 0,
    ) -> None:
        if threads > 0:  # process-wide, as torchrun's OMP_NUM_THREADS: procs share the cores
            torch.set_num_threads(threads)
        self.rank = current_rank().rank
        self._node = context().actor_instance._home()  # its proc's: the handoffs it offers to
        mark_worker()  # remote functions here may make and read OpaqueRefs
        self.refs: dict[int, Any] = {}
        # process groups by (stream, ranks): each stream's collectives match up in its own order
        self.groups: dict[tuple[str, tuple[int, ...]], Any] = {}
        # the same groups as torch.distributed.ProcessGroups, for remote functions' arguments
        self.process_groups: dict[tuple[str, tuple[int, ...]], Any] = {}
        # (Each stream makes its own groups, so a key of groups is only written by that
        # stream's thread.)
        self.timeout = datetime.timedelta(seconds=timeout_s)
        # The member's side of the engine's RendezvousStore, made here so that its calls
        # go out as this actor (torch makes them from the stream threads).
        self._store: Any = actor_store(store, timeout_s)
        self.device = _pick_device(device, self.rank)
        self.streams = Streams(gpu_timing.timed(self._one, self.device), self.device)

    def __cleanup__(self, exc: Any = None) -> None:
        self.streams.close()
        for t in self.streams.threads():
            t.join(timeout=1.0)  # best effort: a stream stuck in a collective is a daemon
        # Process groups own threads that must not outlive the interpreter's shutdown.
        for pg in self.groups.values():
            try:
                pg.shutdown()
            except Exception:
                log.debug("shutting a process group down failed", exc_info=True)
        for pg in self.process_groups.values():
            unregister_group_ranks(pg)
        self.process_groups.clear()
        self.groups.clear()
        self.refs.clear()
        self._store = None

    @endpoint
    def info(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "rank": self.rank, "device": str(self.device)}

    @endpoint
    def run(self, stream: str, commands: list[Any] | bytes) -> None:
        """Queue ``commands`` on ``stream``, after what was queued there; never raises.

        ``commands`` is a list, or the list pickled by the client's engine (plain
        commands only, see ``engine._packed``).
        """
        cmds = pickle.loads(commands) if isinstance(commands, bytes) else commands
        self.streams.submit(stream, cmds)

    @endpoint
    def sync(self) -> None:
        """Return once every stream has run what was sent before."""
        self.streams.barrier()

    @endpoint
    def fetch(self, ids: list[int]) -> list[Any]:
        """The values of ``ids`` on this proc (moved to CPU), ``Failure`` where one failed.

        Waits for every stream to run what was sent before.
        """
        self.streams.barrier()
        out = []
        for i in ids:
            v = self.refs.get(i)
            if isinstance(v, torch.Tensor):
                v = v.detach().to("cpu", copy=True)
            elif v is None:
                v = Failure("(deleted)", self.rank, "KeyError", f"no tensor {i}", "")
            out.append(v)
        return out

    @endpoint
    def call_remote(self, fn: Any, args: Any, kwargs: Any, groups: bool = False) -> Any:
        """``fn(*args, **kwargs)`` on local shards; its result (tensors moved to CPU).

        ``groups``: the arguments hold ``GroupArg``s, replaced by process groups (made
        on this, the actor's, thread under the "main" stream's key: every stream is idle
        here after the barrier, and no command arrives before this call returns).
        """
        self.streams.barrier()
        if groups:
            args, kwargs = self._bind_groups((args, kwargs))
        try:
            a, k = self._resolve((args, kwargs))
        except _Failed as f:
            raise RuntimeError(
                f"an argument of {target_name(fn)} failed to compute: op {f.failure.op} failed "
                f"on rank {f.failure.rank}: {f.failure.type_name}: {f.failure.message}"
            ) from None
        result = resolve_function(fn)(*a, **k)
        return pytree.tree_map(
            lambda x: x.detach().to("cpu") if isinstance(x, torch.Tensor) else x, result
        )

    @endpoint
    def stats(self) -> dict[str, int]:
        self.streams.barrier()
        return {
            "tensors": sum(isinstance(v, torch.Tensor) for v in self.refs.values()),
            "failed": sum(isinstance(v, Failure) for v in self.refs.values()),
            "groups": len(self.groups),
        }

    # -- commands ----------------------------------------------------------

    def _one(self, cmd: Any) -> None:
        if isinstance(cmd, CallOp):
            kwargs = cmd.kwargs
            dev = kwargs.get("device") if self.device.type != "cpu" else None
            if dev is not None and torch.device(dev).type == self.device.type:
                kwargs = {**kwargs, "device": self.device}  # the client's "cuda:0": this GPU
            self._call(cmd.op, resolve_op(cmd.op), cmd.args, kwargs, cmd.outs, cmd.mutates)
            if cmd.factory and self.device.type != "cpu" and "device" not in cmd.kwargs:
                for i in cmd.outs:  # made without a device: this proc's device, as the client says
                    v = self.refs.get(i) if i is not None else None
                    if i is not None and isinstance(v, torch.Tensor) and v.device != self.device:
                        self.refs[i] = v.to(self.device)
        elif isinstance(cmd, Delete):
            for i in cmd.ids:
                self.refs.pop(i, None)
        elif isinstance(cmd, Reduce):
            collectives.reduce(self, cmd)
        elif isinstance(cmd, ReduceMany):
            collectives.reduce_many(self, cmd)
        elif isinstance(cmd, SendTo):
            self._send_to(cmd)
        elif isinstance(cmd, MeshRank):
            self._mesh_rank(cmd)
        elif isinstance(cmd, Signal):
            self.streams.signal(cmd.key)
        elif isinstance(cmd, Wait):
            self.streams.wait(cmd.key)
        elif isinstance(cmd, BorrowCreate):
            self.streams.wait(cmd.key)
            self.refs[cmd.out] = self.refs.get(cmd.src)
        elif isinstance(cmd, BorrowDrop):
            v = self.refs.pop(cmd.alias, None)
            if cmd.mutable and isinstance(v, Failure):
                self.refs[cmd.src] = v
            self.streams.signal(cmd.key)
        elif isinstance(cmd, HandOff):
            self._hand_off(cmd)
        elif isinstance(cmd, RunRemote):
            name = target_name(cmd.fn)
            args, kwargs = cmd.args, cmd.kwargs
            try:
                fn = resolve_function(cmd.fn)
                if cmd.groups:
                    args, kwargs = self._bind_groups((args, kwargs))
            except BaseException as e:  # an import that calls sys.exit(), say
                self._fail((*cmd.outs, *cmd.mutates), self._failure(f"remote {name}", e))
                return
            self._call(f"remote {name}", fn, args, kwargs, cmd.outs, cmd.mutates)
        else:  # pragma: no cover - a client/worker version mismatch
            raise TypeError(f"unknown tensor engine command {cmd!r}")

    def _resolve(self, tree: Any) -> Any:
        """``tree`` (tuples, lists, dicts) with each ``Ref`` replaced by its tensor.

        Raises ``_Failed`` for a failed input, ``KeyError`` for a deleted one.
        """
        t = type(tree)
        if t is Ref:
            v = self.refs.get(tree.id)
            if isinstance(v, Failure):
                raise _Failed(v)
            if v is None:
                raise KeyError(f"tensor {tree.id} was deleted or never defined on this proc")
            return v
        if t is tuple or t is list:
            refs = self.refs
            out = []
            for x in tree:  # flat arguments (most ops'): no recursion, no generator
                tx = type(x)
                if tx is Ref:
                    v = refs.get(x.id)
                    if v is None or isinstance(v, Failure):
                        v = self._resolve(x)  # raises the precise error
                    out.append(v)
                elif (
                    tx is tuple
                    or tx is list
                    or tx is dict
                    or tx is OpaqueRef
                    or isinstance(x, (tuple, list, dict))
                ):
                    out.append(self._resolve(x))
                else:
                    out.append(x)
            return out if t is list else tuple(out)
        if t is dict:
            return {k: self._resolve(v) for k, v in tree.items()}
        if isinstance(tree, (tuple, list, dict)):  # a namedtuple, an OrderedDict...
            return pytree.tree_map(self._resolve, tree, is_leaf=lambda x: type(x) is Ref)
        if t is OpaqueRef:  # its key, a tensor of this worker's table
            return OpaqueRef._create(self._resolve(tree._key))
        return tree

    def _fail(self, ids: Any, failure: Failure) -> None:
        kept = False
        for i in ids:
            if i is not None:
                self.refs[i] = failure
                kept = True
        if not kept:  # no result carries it (broadcast, propagate="inspect"): say it here
            print(
                f"danaus: {failure.op} failed on rank {failure.rank} and has no result to "
                f"carry the error: {failure.type_name}: {failure.message}\n{failure.traceback}",
                file=sys.stderr,
                flush=True,
            )

    def _failure(self, op: str, e: BaseException) -> Failure:
        tb = "".join(traceback.format_exception(type(e), e, e.__traceback__))
        return Failure(op, self.rank, type(e).__name__, str(e), tb)

    def _call(
        self,
        name: str,
        fn: Any,
        args: Any,
        kwargs: Any,
        outs: tuple[int | None, ...],
        mutates: tuple[int, ...],
    ) -> None:
        try:
            a, k = self._resolve((args, kwargs))
            result = fn(*a, **k)
        except _Failed as f:
            self._fail((*outs, *mutates), f.failure)
            return
        except BaseException as e:  # SystemExit too: user code must not end the stream
            self._fail((*outs, *mutates), self._failure(name, e))
            return
        self._define(name, result, outs, mutates)

    def _define(
        self, name: str, result: Any, outs: tuple[int | None, ...], mutates: tuple[int, ...]
    ) -> None:
        """``outs`` are the tensors of ``result``, in order (fails them all on a mismatch)."""
        if isinstance(result, torch.Tensor):
            leaves = [result]
        else:
            leaves = [x for x in pytree.tree_leaves(result) if isinstance(x, torch.Tensor)]
        if len(leaves) != len(outs):
            err = RuntimeError(
                f"{name} returned {len(leaves)} tensors on the worker but the client expected "
                f"{len(outs)}"
            )
            self._fail((*outs, *mutates), self._failure(name, err))
            return
        for i, t in zip(outs, leaves, strict=True):
            if i is not None:
                self.refs[i] = t

    def _hand_off(self, cmd: HandOff) -> None:
        """Give the local shards to the actor's call on this proc; wait until it returns.

        The shards themselves, not copies: what the endpoint writes in place is
        what later ops on this stream see. A failed input makes the call raise.
        """
        actor_rank = next((a for g, a in cmd.ranks if g == self.rank), None)
        outs = cmd.outs
        name = f"{cmd.what or cmd.mesh_id}.rref on actor {actor_rank}"
        if actor_rank is None:
            if outs:  # the client checks that each proc has an actor: only a bug gets here
                err = RuntimeError(f"no actor on worker {self.rank} computes its shard")
                self._fail(outs, self._failure(name, err))
            return
        values: dict[int, Any] = {}
        error: BaseException | None = None
        failed: Failure | None = None
        cuda = self.device.type == "cuda"
        try:  # whatever happens here, the actor is told: it waits for this offer
            for index, ref in cmd.refs:
                v = self.refs.get(ref)
                if isinstance(v, Failure):
                    error, failed = RemoteTensorError(v, self.rank, {}), v
                    break
                if v is None:
                    error = KeyError(f"tensor {ref} was deleted before the actor call that uses it")
                    break
                values[index] = v
            if cuda:  # the actor's thread uses the default CUDA stream: hand over finished values
                torch.cuda.current_stream().synchronize()
        except Exception as e:
            error = e
        outcome = handoff.offer(
            self._node, cmd.key, cmd.total, error or values, cmd.mesh_id, actor_rank
        )
        if cuda:  # and what the endpoint queued on the default stream comes before what follows
            torch.cuda.current_stream().wait_stream(torch.cuda.default_stream())
        if outs is None:
            return
        if failed is not None:  # an input had failed: the results fail with it
            self._fail(outs, failed)
        elif outcome is None:
            err = RuntimeError(f"actor {actor_rank} stopped or failed before it ran the call")
            self._fail(outs, self._failure(name, err))
        elif not outcome[0]:
            self._fail(outs, self._failure(name, outcome[1]))
        else:
            self._define(name, outcome[1], outs, ())

    def _mesh_rank(self, cmd: MeshRank) -> None:
        coord = cmd.shape.coordinates(self.rank)[cmd.dim]
        self.refs[cmd.out] = torch.full((), coord, dtype=torch.long, device=self.device)

    def _send_to(self, cmd: SendTo) -> None:
        """Copy ``src`` from each pair's source rank to its destination (``to_mesh``)."""
        mine = [(d, s) for d, s in cmd.pairs if self.rank in (d, s)]
        if not mine:
            return
        name = "to_mesh"
        src = self.refs.get(cmd.src) if cmd.src is not None else None
        failure = src if isinstance(src, Failure) else None
        try:
            pairs = sorted({(min(d, s), max(d, s)) for d, s in mine if d != s})
            groups = {p: self._group(p) for p in pairs}  # one global order: no deadlock
            works = []
            received: tuple[torch.Tensor, torch.Tensor] | None = None
            for d, s in mine:
                if d == s:  # the same proc on both meshes: a local copy
                    if isinstance(src, torch.Tensor):
                        received = (torch.zeros(1, dtype=torch.long), src.clone())
                    else:
                        received = (torch.tensor([1 + self.rank]), torch.empty(0))
                    continue
                pg = groups[(min(d, s), max(d, s))]
                if s == self.rank:
                    data = (
                        src.contiguous()
                        if isinstance(src, torch.Tensor)
                        else torch.zeros(cmd.shape, dtype=cmd.dtype, device=self.device)
                    )
                    flag = torch.tensor(
                        [0 if isinstance(src, torch.Tensor) else 1 + self.rank], device=self.device
                    )
                    peer = 1 if d > s else 0
                    works.append(pg.send([flag], peer, 0))
                    works.append(pg.send([data], peer, 1))
                if d == self.rank:
                    flag = torch.zeros(1, dtype=torch.long, device=self.device)
                    buf = torch.empty(cmd.shape, dtype=cmd.dtype, device=self.device)
                    peer = 1 if s > d else 0
                    works.append(pg.recv([flag], peer, 0))
                    works.append(pg.recv([buf], peer, 1))
                    received = (flag, buf)
            for w in works:
                w.wait()
        except Exception as e:
            if cmd.out is not None and any(d == self.rank for d, _ in mine):
                self._fail((cmd.out,), self._failure(name, e))
            return
        if cmd.out is None or received is None:
            return
        flag, buf = received
        if int(flag) > 0:
            origin = int(flag) - 1
            failure = failure or Failure(
                name, origin, "RemoteTensorError", f"the source failed on rank {origin}", ""
            )
            self._fail((cmd.out,), failure)
        else:
            self.refs[cmd.out] = buf

    # -- collectives -------------------------------------------------------

    def _group(self, ranks: tuple[int, ...]) -> Any:
        """The process group of ``ranks`` for the calling stream, made at first use."""
        key = (current_stream(), ranks)
        pg = self.groups.get(key)
        if pg is None:
            prefix = f"pg/{key[0]}/" + "_".join(map(str, ranks)) + "/"
            store = dist.PrefixStore(prefix, self._store)  # type: ignore[attr-defined]
            pg = new_group(store, ranks.index(self.rank), len(ranks), self.device, self.timeout)
            self.groups[key] = pg
        return pg

    def _bind_groups(self, tree: Any) -> Any:
        """``tree`` with each ``GroupArg`` replaced by this proc's process group of it."""
        return pytree.tree_map(lambda x: self._process_group(x) if type(x) is GroupArg else x, tree)

    def _process_group(self, arg: GroupArg) -> Any:
        """The ``torch.distributed.ProcessGroup`` of the group of ``arg`` holding this proc,
        for the calling stream: the backend ``reduce`` uses (made at first use), wrapped."""
        ranks = next((g for g in arg.groups if self.rank in g), None)
        if ranks is None:  # the client checks the group's mesh is the active one
            raise RuntimeError(
                f"worker {self.rank} is in no group of the process group over {list(arg.dims)}"
            )
        key = (current_stream(), ranks)
        pg = self.process_groups.get(key)
        if pg is None:
            backend = self._group(ranks)
            name = f"danaus/{key[0]}/" + "_".join(map(str, ranks))
            store = dist.PrefixStore(name + "/", self._store)  # type: ignore[attr-defined]
            pg = dist.ProcessGroup(store, ranks.index(self.rank), len(ranks))
            kind = dist.ProcessGroup.BackendType
            # members sharing a GPU have gloo (NCCL refuses them), for CUDA tensors too:
            # its all-reduce and broadcast take them, its other collectives raise
            nccl = self.device.type == "cuda" and not isinstance(backend, StagedGroup)
            if isinstance(backend, StagedGroup):
                backend = backend.group
            pg._set_default_backend(kind.NCCL if nccl else kind.GLOO)
            for device_type in {"cpu", self.device.type}:
                if device_type == "cpu" and nccl:
                    continue
                pg._register_backend(
                    torch.device(device_type), kind.NCCL if nccl else kind.GLOO, backend
                )
            pg._set_group_name(name)  # type: ignore[arg-type]  # GroupName is a str
            register_group_ranks(pg, ranks)
            self.process_groups[key] = pg
        return pg
