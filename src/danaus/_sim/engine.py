"""The seam: a tensor engine whose workers are simulated, and the mesh that uses it.

``danaus._tensor`` turns every torch op on a mesh into commands and hands
them to the mesh's engine (``Engine.send``); a real engine queues them for
the worker actors. ``SimEngine`` has the same interface and feeds each
command, as it is sent, to a ``core.Simulator``: no procs, no devices, no
values. ``SimulatedMesh`` is a ``ProcMesh`` whose engine is a ``SimEngine``,
so ``with mesh.activate():`` and every tensor-engine call work on it
unchanged. ``fetch_shard`` returns zeros of the right sizes, at the
simulated time the value would be ready (the controller waits for it).

The controller's trace names the messages Monarch's controller sends for the
same program (``monarch/common/client.py``, ``borrows.py``), so a Monarch
program's controller trace reads the same on both: deletions go as one
``DeleteRefs`` before the next message; an op that returns its input (``add_``)
gave its result a name of its own in Monarch, deleted with the next message; a
borrow is ``BorrowCreate``, ``BorrowFirstUse`` (the borrowed tensor's first use),
``BorrowLastUse`` (its last tensor deleted, or the drop), ``BorrowDrop``; a
fetch is ``SendValue`` then ``RequestStatus``; ``mesh.exit()`` is
``RequestStatus`` (when anything ran since the last) then ``Exit``. danaus's
``Signal``/``Wait`` are the halves of those borrow messages and have no entry.

``SimEngine`` composes its parts: a ``storage.RefTable`` (each ref's spec and the
storage it shares), a ``borrows.BorrowTracer`` (the borrow messages), a
``collectives.Collectives`` (collectives and sends, placed and priced) and the
``endpoints`` it hands the tensor layer.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import math
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils import _pytree as pytree

from .._mesh import Shape
from .._tensor import simulator as _meta_labels
from .._tensor.function import target_name
from .._tensor.messages import (
    BorrowCreate,
    BorrowDrop,
    CallOp,
    Delete,
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
from .._tensor.stream import get_active_stream
from .borrows import BorrowTracer
from .collectives import Collectives, group_args
from .core import Simulator, WorkerGroup
from .costs import CostModel, TensorSpec
from .endpoints import Targets, Workers
from .refs import _META, _client_holding, _is_ref, _ns, _resolve
from .storage import RefTable, ref_ids

__all__ = ["SimEngine"]

_DEBUG = False


class SimEngine:
    """A tensor engine whose workers are a ``core.Simulator`` (see the module docstring)."""

    def __init__(self, sim: Simulator, shape: Shape, gpus_per_host: int) -> None:
        self.sim = sim
        self.costs: CostModel = sim.costs
        # what a simulated GPU's tensors are on the client: "cuda" where torch has CUDA;
        # else "meta" (torch's autograd engine aborts on a CUDA tensor without CUDA)
        self.device = torch.device("cuda", 0) if torch.cuda.is_available() else _META
        self.workers = Workers(shape)
        self.size = len(shape.ranks())
        self.gpus_per_host = gpus_per_host
        # never set: a closed engine would make engine_for() spawn real workers for the mesh
        self.closed = False
        self.exited = False  # after mesh.exit(): every use raises
        self.broken = None
        self.messages_sent = 0
        self._ids = itertools.count(1)
        self._lock = threading.RLock()
        self._pending: list[tuple[int, str]] = []  # releases not yet simulated
        self._live: dict[Any, tuple[int, str]] = {}  # weakref to a handle -> its release
        self.refs = RefTable()
        self._ranks: dict[Shape, np.ndarray] = {}
        self._collectives = Collectives(sim, self.costs, gpus_per_host)
        # Monarch's controller messages (see the module docstring)
        self._borrows = BorrowTracer(sim.next_command)
        self._results_dropped = 0  # in-place results Monarch deletes with the next message
        self._status_due = False  # work sent since the last RequestStatus

    # -- the engine interface the tensor layer uses ---------------------------------------

    def new_id(self) -> int:
        return next(self._ids)

    def track(self, handle: Any, ref: int, stream: str) -> None:
        self.refs.track(handle, ref)
        self._live[weakref.ref(handle, self._collected)] = (ref, stream)

    def _collected(self, wr: Any) -> None:
        entry = self._live.pop(wr, None)
        if entry is not None:
            self.release(*entry)

    def release(self, ref: int, stream: str = "main") -> None:
        if not self.exited:
            self._pending.append((ref, stream))  # simulated before the next command

    def check(self) -> None:
        if self.exited:
            raise RuntimeError(
                "this simulated mesh has exited (mesh.exit()); make a new danaus.Simulator"
            )

    def watch(self, cf: concurrent.futures.Future[Any]) -> None:
        pass

    @contextlib.contextmanager
    def as_owner(self) -> Iterator[None]:
        yield

    def targets(self, shape: Shape) -> Targets:
        return Targets(self, shape)

    def flush(self) -> None:
        with self._lock:
            self._drain()

    def send_held(self, ops: list[tuple[Shape, str, Any]]) -> None:
        for shape, stream, cmd in ops:
            self.send(shape, cmd, stream=stream)

    def close(self) -> None:
        self.flush()
        self.exited = True

    def exit(self) -> None:
        """``mesh.exit()``: Monarch's controller asks for the workers' status (when work
        was sent since it last did) and sends ``Exit``; deletions still pending go with
        no message (the controller sends none after ``Exit``), so they are not simulated."""
        with self._lock:
            self._pending.clear()
            self._results_dropped = 0
            if self._status_due:
                self.sim.next_command("RequestStatus")
                self._status_due = False
            self.sim.next_command("Exit")
            self.exited = True

    def send(self, shape: Shape, *cmds: Any, stream: str | None = None) -> None:
        """Simulate ``cmds`` for the ranks of ``shape`` on ``stream``, in order, now."""
        self.check()
        if stream is None:
            stream = get_active_stream().name
        held = _client_holding()
        if held is not None:  # a coalescing block holds them until it ends
            ops = held.setdefault(self, [])
            ops.extend((shape, stream, c) for c in cmds)
            return
        with self._lock:
            self._drain()
            for cmd in cmds:
                if _DEBUG:
                    print("SIM", stream, cmd)
                self.messages_sent += 1
                self._simulate(shape, stream, cmd)

    # -- bookkeeping -----------------------------------------------------------------------

    def ranks(self, shape: Shape) -> np.ndarray:
        r = self._ranks.get(shape)
        if r is None:
            r = self._ranks[shape] = np.array(sorted(shape.ranks()), dtype=np.int64)
        return r

    def _groups(self, shape: Shape) -> list[WorkerGroup]:
        return self.sim.groups_for(self.ranks(shape), key=shape)

    def _drain(self) -> None:
        """Simulate the deletions of the handles collected since the last command: one
        ``DeleteRefs``, split where the last tensor of a borrow went (Monarch sends
        ``BorrowLastUse`` then, after the deletions before it)."""
        while self._pending or self._results_dropped:
            pending, self._pending = self._pending, []
            batch: dict[str, list[int]] = {}
            results, self._results_dropped = self._results_dropped, 0
            for ref, stream in pending:
                if self._borrows.ended(ref):  # its borrow's drop deleted it already
                    continue
                b = self._borrows.released(ref)
                if b is not None:  # the borrow's last tensor: BorrowLastUse after these
                    self._delete_refs(batch, results)
                    batch, results = {}, 0
                    self._borrows.last_use(b)
                batch.setdefault(stream, []).append(ref)
            self._delete_refs(batch, results)

    def _delete_refs(self, by_stream: dict[str, list[int]], results: int) -> None:
        """One ``DeleteRefs`` message: ``by_stream``'s ids, and ``results`` in-place results
        (names Monarch gave and nothing here holds)."""
        if not by_stream and not results:
            return
        self.sim.next_command("DeleteRefs")
        for stream, refs in by_stream.items():
            self._free(refs, stream)

    def _delete(self, refs: list[int], stream: str) -> None:
        self.sim.next_command("DeleteRefs")
        self._free(refs, stream)

    def _free(self, refs: list[int], stream: str) -> None:
        for g in self.sim.workers:
            live = g.live
            if not any(r in live for r in refs):
                continue
            ts = max(g.stream(stream).free, self.sim.now)
            for r in refs:
                self.sim.free(g, r, ts, stream)
        for r in refs:
            self.refs.forget(r)

    def _allocate(
        self,
        groups: list[tuple[WorkerGroup, int, int]],
        outs: Any,
        stream: str,
        alias_of: int | None = None,
    ) -> None:
        for ref in outs:
            if ref is None:
                continue
            key, nbytes = self.refs.place(ref, alias_of)
            self._borrows.view_made(self.refs.storage(ref), ref)
            dev = self.refs.device(ref)
            for g, start, _end in groups:
                self.sim.alloc(g, ref, key, nbytes, dev, start, stream)

    def _meta(self) -> tuple[Any, ...]:
        return _meta_labels.meta_stack()[-1:]

    # -- the commands ----------------------------------------------------------------------

    def _simulate(self, shape: Shape, stream: str, cmd: Any) -> None:
        sim = self.sim
        kind = type(cmd)
        if kind is CallOp:
            self._call_op(shape, stream, cmd)
        elif kind is Delete:
            self._delete(list(cmd.ids), stream)
        elif kind is Reduce:
            self._reduce(shape, stream, cmd, (cmd.src,), [cmd.out] if not cmd.inplace else [])
        elif kind is ReduceMany:
            self._reduce(shape, stream, cmd, cmd.srcs, [] if cmd.inplace else list(cmd.outs))
        elif kind is Signal:  # the origin's half of Monarch's BorrowCreate
            sim.next_command(None)
            for g in self._groups(shape):
                g.signals[cmd.key] = (max(g.stream(stream).free, sim.now), stream)
        elif kind is Wait:  # the origin's half of Monarch's BorrowDrop
            sim.next_command(None)
            self._wait(shape, stream, cmd.key)
        elif kind is BorrowCreate:
            sim.next_command("BorrowCreate")
            self._status_due = True
            placed = self._wait(shape, stream, cmd.key)
            self._allocate(placed, [cmd.out], stream, alias_of=cmd.src)
            self._borrows.created(cmd.out, self.refs.storage(cmd.out))
        elif kind is BorrowDrop:
            ended = self._borrows.dropped(cmd.alias)
            sim.next_command("BorrowDrop")
            for g in self._groups(shape):
                s = g.stream(stream)
                ts = max(s.free, sim.now)
                for r in ended:
                    sim.free(g, r, ts, stream)
                g.signals[cmd.key] = (ts, stream)
            for r in ended:
                self.refs.forget(r)
        elif kind is MeshRank:
            sim.next_command("MeshRank")
            self._status_due = True
            placed = sim.task(self._groups(shape), stream, "mesh_rank", 0, traced=False)
            self._allocate(placed, [cmd.out], stream)
        elif kind is SendTo:
            self._send_to(stream, cmd)
        elif kind is RunRemote:
            self._remote(shape, stream, cmd)
        elif kind is HandOff:
            raise NotImplementedError(
                "passing mesh tensors to actor endpoints is not simulated: a simulated mesh "
                "has no procs to run actors on"
            )
        else:
            raise NotImplementedError(f"the simulator does not know the command {cmd!r}")

    def _wait(self, shape: Shape, stream: str, key: int) -> list[tuple[WorkerGroup, int, int]]:
        sim = self.sim
        out = []
        for g in self._groups(shape):
            s = g.stream(stream)
            start = max(s.free, sim.now)
            when, other = g.signals.pop(key, (start, stream))
            end = max(start, when)
            s.free = end
            sim._record(s, start, end, f"waiting for {other}", ())
            out.append((g, start, end))
        return out

    def _call_op(self, shape: Shape, stream: str, cmd: CallOp) -> None:
        sim = self.sim
        name = cmd.op.replace("::", ".")
        outs = [r for r in cmd.outs if r is not None]
        inputs = ref_ids(cmd.args) + ref_ids(cmd.kwargs)
        self._borrows.first_use(inputs)
        sim.next_command(name)
        self._status_due = True
        # an op that returns its input (add_): Monarch named the result anew and deletes
        # the name with its next message
        self._results_dropped += len(cmd.outs) - len(outs)
        groups = self._groups(shape)
        # a view's result is described on the client; the worker only names it
        view_only = (
            len(cmd.outs) == 1
            and outs
            and inputs
            and not cmd.mutates
            and self.refs.shares_storage(outs[0], inputs[0])
        )
        if view_only:
            placed = sim.task(groups, stream, name, 0, traced=False)
            self._allocate(placed, outs, stream)
            return
        devices = {self.refs.device(r) for r in outs + inputs}
        device = "cuda" if "cuda" in devices else "cpu"
        if name in ("aten._to_copy", "aten.copy_", "aten.to") and len(devices) > 1:
            cost = self.costs.host_copy(self.refs.total_bytes(inputs))
        else:
            args, kwargs = self.refs.specs(cmd.args), self.refs.specs(cmd.kwargs)
            cost = self.costs.op(cmd.op, args, kwargs, device)
        placed = sim.task(groups, stream, name, _ns(cost), self._meta())
        self._allocate(placed, outs, stream)

    def _reduce(self, shape: Shape, stream: str, cmd: Any, srcs: Any, outs: list[int]) -> None:
        sim = self.sim
        if cmd.reduction == "stack":
            label = "all_to_all" if cmd.scatter else "all_gather"
            kind = label
        else:
            # Monarch's trace names a plain all-reduce "reduce_scatter" and a scattering one
            # "all_reduce"; the cost is that of what runs.
            label = "all_reduce" if cmd.scatter else "reduce_scatter"
            kind = "reduce_scatter" if cmd.scatter else "all_reduce"
        self._borrows.first_use(srcs)
        for _ in srcs:  # Monarch's controller sends one Reduce a tensor
            sim.next_command("Reduce")
        self._status_due = True
        self._groups(shape)  # split groups the collective treats differently
        sub = self._collectives.subgroups(cmd.groups)
        cost = self._collectives.cost(kind, self.refs.total_bytes(srcs), sub)
        comps = self._collectives.components(sub)
        placed = sim.synchronised(comps, stream, label, _ns(cost), self._meta())
        self._allocate(placed, outs, stream)

    def _send_to(self, stream: str, cmd: SendTo) -> None:
        sim = self.sim
        if cmd.src is not None:
            self._borrows.first_use([cmd.src])
        sim.next_command("SendTensor")
        self._status_due = True
        spec = self.refs.spec.get(cmd.src) if cmd.src is not None else None
        nbytes = spec.nbytes if spec is not None else math.prod(cmd.shape) * cmd.dtype.itemsize
        placed = self._collectives.send(stream, cmd.pairs, spec, nbytes, self._meta())
        if cmd.out is not None:
            self._allocate(placed, [cmd.out], stream)

    def _remote(
        self, shape: Shape, stream: str, cmd: RunRemote, message: str | None = None
    ) -> None:
        """A remote function; the controller's trace names it (Monarch's ``CallFunction``)
        unless ``message`` names the message that carries it."""
        sim = self.sim
        name = target_name(cmd.fn)
        self._borrows.first_use(ref_ids(cmd.args) + ref_ids(cmd.kwargs))
        sim.next_command(message or name)
        self._status_due = True
        groups = self._groups(shape)
        args, kwargs = self.refs.specs(cmd.args), self.refs.specs(cmd.kwargs)
        pgs = group_args((cmd.args, cmd.kwargs)) if cmd.groups else []
        fn = None if pgs else _resolve(cmd.fn)
        cost = self.costs.remote(name, args, kwargs, fn)
        outs = [r for r in cmd.outs if r is not None]
        if pgs:
            # a function given a process group runs its collectives with the group: its
            # members start together, and it moves its tensor arguments once around it
            sub = self._collectives.subgroups(pgs[0].groups)
            leaves = pytree.tree_leaves(args, is_leaf=_is_ref)
            nbytes = sum(s.nbytes for s in leaves if isinstance(s, TensorSpec))
            cost += self._collectives.cost("all_reduce", nbytes, sub)
            comps = self._collectives.components(sub)
            placed = sim.synchronised(comps, stream, name, _ns(cost), self._meta())
        else:
            placed = sim.task(groups, stream, name, _ns(cost), self._meta())
        self._allocate(placed, outs, stream)

    # -- values back to the controller -----------------------------------------------------

    def fetch(self, shape: Shape, ids: list[int]) -> list[Any]:
        """Zeros shaped like ``ids``; the controller's clock moves to when they arrive."""
        with self._lock:
            self._drain()
            sim = self.sim
            self._borrows.first_use(ids)
            sim.next_command("SendValue")
            cost = self.costs.host_copy(self.refs.total_bytes(ids))
            placed = sim.task(self._groups(shape), "main", "fetch_shard", _ns(cost), self._meta())
            if placed:
                sim.now = max(sim.now, max(end for _g, _s, end in placed))
            self._status()
            return [self.refs.zeros(r) for r in ids]

    def _status(self) -> None:
        """Monarch's controller asks for the workers' status after a fetch, and the value
        it waits for answers it."""
        self.sim.next_command("RequestStatus")
        self._status_due = False

    def call_and_fetch(
        self, shape: Shape, fn: Any, args: Any, kwargs: Any, groups: bool
    ) -> list[Any]:
        """``remote_fn.call(...)``: simulated on every rank of ``shape``, then the
        controller waits for the results; their values come from running ``fn`` here on
        zeros (``None`` where it cannot run without a process group)."""
        with self._lock:
            self._drain()
            cmd = RunRemote(fn, args, kwargs, (), (), groups)
            self._remote(shape, "main", cmd, message="SendValue")
            placed = self.sim.task(self._groups(shape), "main", "fetch_result", 0, traced=False)
            if placed:
                self.sim.now = max(self.sim.now, max(end for _g, _s, end in placed))
            self._status()
        value: Any = None
        if not groups:

            def zero(x: Any) -> Any:
                return self.refs.zeros(x.id) if isinstance(x, Ref) else x

            real = pytree.tree_map(zero, args, is_leaf=_is_ref)
            kw = pytree.tree_map(zero, kwargs, is_leaf=_is_ref)
            try:
                value = _resolve(fn)(*real, **kw)
            except Exception:
                value = None
        return [value] * len(shape.ranks())
