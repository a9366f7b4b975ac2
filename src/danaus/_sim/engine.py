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
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import math
import threading
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import _disable_current_modes

from .._actor.core.future import Future
from .._mesh import Shape, Slice
from .._mesh.value_mesh import ValueMesh
from .._tensor import simulator as _meta_labels
from .._tensor.function import target_name
from .._tensor.messages import (
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
from .._tensor.stream import get_active_stream
from .core import Simulator, WorkerGroup
from .costs import CostModel, TensorSpec
from .refs import _META, _client_holding, _is_ref, _ns, _resolve

__all__ = ["SimEngine"]

_DEBUG = False

# Ops that only re-describe a tensor's storage (one view as the result): free, untraced.
_VIEW_ONLY = object()


class _Targets:
    """What ``engine.targets(shape)`` gives the tensor layer: the workers' endpoints."""

    def __init__(self, engine: SimEngine, shape: Shape) -> None:
        self.fetch = _FetchEndpoint(engine, shape)
        self.call_remote = _RemoteEndpoint(engine, shape)
        self._shape = shape


class _Reply:
    """A reply as the tensor layer reads it (``reply._cf``)."""

    def __init__(self, value: Any) -> None:
        self._cf: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._cf.set_result(value)


class _FetchEndpoint:
    def __init__(self, engine: SimEngine, shape: Shape) -> None:
        self.engine = engine
        self.shape = shape

    def call_one(self, ids: list[int]) -> _Reply:
        return _Reply(self.engine.fetch(self.shape, ids))


class _RemoteEndpoint:
    def __init__(self, engine: SimEngine, shape: Shape) -> None:
        self.engine = engine
        self.shape = shape

    def _run(self, fn: Any, args: Any, kwargs: Any, groups: bool) -> list[Any]:
        return self.engine.call_and_fetch(self.shape, fn, args, kwargs, groups)

    def call_one(self, fn: Any, args: Any, kwargs: Any, groups: bool) -> Future[Any]:
        values = self._run(fn, args, kwargs, groups)
        return Future._resolved(values[0], "a simulated remote function")

    def call(self, fn: Any, args: Any, kwargs: Any, groups: bool) -> Future[Any]:
        values = self._run(fn, args, kwargs, groups)
        ext = self.shape.extent
        vm = ValueMesh(Shape(list(ext.labels), Slice.new_row_major(list(ext.sizes))), values)
        return Future._resolved(vm, "a simulated remote function")

    def _send_to_port(self, a: Any, kw: Any, port: Any, selection: str) -> None:
        raise NotImplementedError(
            "send(remote_fn, ..., port=...) is not simulated: call the function with "
            "fn.call(...) or fn(...) on a simulated mesh"
        )


class _Workers:
    def __init__(self, shape: Shape) -> None:
        self._shape = shape


@dataclass
class _BorrowTrace:
    """A live borrow, for the controller's trace: ``names`` are the client's tensors in
    the borrowed storage (the borrowed tensor and the views made from it)."""

    alias: int
    storage: Any  # the borrowed tensor's danaus Storage, which its views share
    names: set[int] = field(default_factory=set)
    used: bool = False  # BorrowFirstUse sent
    last: bool = False  # BorrowLastUse sent


class SimEngine:
    """A tensor engine whose workers are a ``core.Simulator`` (see the module docstring)."""

    def __init__(self, sim: Simulator, shape: Shape, gpus_per_host: int) -> None:
        self.sim = sim
        self.costs: CostModel = sim.costs
        # what a simulated GPU's tensors are on the client: "cuda" where torch has CUDA;
        # else "meta" (torch's autograd engine aborts on a CUDA tensor without CUDA)
        self.device = torch.device("cuda", 0) if torch.cuda.is_available() else _META
        self.workers = _Workers(shape)
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
        self._handles: dict[int, Any] = {}  # id -> weakref to its client handle
        self._spec: dict[int, TensorSpec] = {}
        self._key_of: dict[int, int] = {}  # id -> storage key
        self._key_refs: dict[int, int] = {}  # storage key -> ids naming it
        self._storage_key: dict[int, tuple[Any, int]] = {}  # id(Storage) -> (it, key)
        self._key_sids: dict[int, list[int]] = {}  # storage key -> id(Storage)s naming it
        self._keys = itertools.count(1)
        self._ranks: dict[Shape, np.ndarray] = {}
        self._sub: dict[Any, np.ndarray] = {}
        self._live: dict[Any, tuple[int, str]] = {}
        # Monarch's controller messages (see the module docstring)
        self._borrows: dict[int, _BorrowTrace] = {}  # borrowed tensor's id -> its borrow
        self._borrowed: dict[int, _BorrowTrace] = {}  # id(borrowed Storage) -> its borrow
        self._name_borrow: dict[int, _BorrowTrace] = {}  # id -> the live borrow it names
        self._ended: set[int] = set()  # ids a borrow's drop deleted (their release: no message)
        self._results_dropped = 0  # in-place results Monarch deletes with the next message
        self._status_due = False  # work sent since the last RequestStatus

    # -- the engine interface the tensor layer uses ---------------------------------------

    def new_id(self) -> int:
        return next(self._ids)

    def track(self, handle: Any, ref: int, stream: str) -> None:
        kind = handle.device.type
        self._spec[ref] = TensorSpec(
            tuple(handle.shape), handle.dtype, "cuda" if kind in ("cuda", "meta") else kind
        )
        self._handles[ref] = weakref.ref(handle)
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

    def targets(self, shape: Shape) -> _Targets:
        return _Targets(self, shape)

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
                if ref in self._ended:  # its borrow's drop deleted it already
                    self._ended.discard(ref)
                    continue
                b = self._name_borrow.pop(ref, None)
                if b is not None:
                    b.names.discard(ref)
                    if not b.names and not b.last:
                        self._delete_refs(batch, results)
                        batch, results = {}, 0
                        self._last_use(b)
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
            self._forget(r)

    def _forget(self, ref: int) -> None:
        self._spec.pop(ref, None)
        self._handles.pop(ref, None)
        key = self._key_of.pop(ref, None)
        if key is not None:
            n = self._key_refs[key] = self._key_refs[key] - 1
            if n == 0:
                del self._key_refs[key]
                for sid in self._key_sids.pop(key, ()):
                    del self._storage_key[sid]

    def _storage(self, ref: int, alias_of: int | None = None) -> tuple[int, int]:
        """(storage key, bytes) of the new tensor ``ref``: its base's for a view or alias
        (a borrowed tensor's views: the borrowed tensor's, which is its origin's)."""
        wr = self._handles.get(ref)
        handle = wr() if wr is not None else None
        storage = getattr(handle, "_storage", None)
        if alias_of is not None and alias_of in self._key_of:
            key = self._key_of[alias_of]
        elif storage is not None and id(storage) in self._storage_key:
            key = self._storage_key[id(storage)][1]
        else:
            key = next(self._keys)
        if storage is not None:
            if id(storage) not in self._storage_key:
                self._storage_key[id(storage)] = (storage, key)
                self._key_sids.setdefault(key, []).append(id(storage))
            b = self._borrowed.get(id(storage))
            if b is not None:  # a view of a borrowed tensor: the borrow's until it goes
                b.names.add(ref)
                self._name_borrow[ref] = b
        self._key_of[ref] = key
        self._key_refs[key] = self._key_refs.get(key, 0) + 1
        return key, self._nbytes(ref)

    def _nbytes(self, ref: int) -> int:
        wr = self._handles.get(ref)
        h = wr() if wr is not None else None
        spec = self._spec.get(ref)
        if h is None:
            return spec.nbytes if spec is not None else 0
        if h.numel() == 0:
            return 0
        span = (
            h.storage_offset()
            + sum((s - 1) * st for s, st in zip(h.shape, h.stride(), strict=True))
            + 1
        )
        return int(span * h.element_size())

    def _device(self, ref: int) -> str:
        spec = self._spec.get(ref)
        return spec.device if spec is not None else "cuda"

    def _specs(self, tree: Any) -> Any:
        return pytree.tree_map(
            lambda x: (
                self._spec.get(x.id, TensorSpec((), torch.float32, "cuda"))
                if isinstance(x, Ref)
                else x
            ),
            tree,
            is_leaf=_is_ref,
        )

    def _ref_ids(self, tree: Any) -> list[int]:
        return [x.id for x in pytree.tree_leaves(tree, is_leaf=_is_ref) if isinstance(x, Ref)]

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
            key, nbytes = self._storage(ref, alias_of)
            dev = self._device(ref)
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
            self._borrow_created(cmd.out)
        elif kind is BorrowDrop:
            ended = self._borrow_dropped(cmd.alias)
            sim.next_command("BorrowDrop")
            for g in self._groups(shape):
                s = g.stream(stream)
                ts = max(s.free, sim.now)
                for r in ended:
                    sim.free(g, r, ts, stream)
                g.signals[cmd.key] = (ts, stream)
            for r in ended:
                self._forget(r)
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

    # -- borrows, as Monarch's controller reports them ---------------------------------------

    def _borrow_created(self, alias: int) -> None:
        wr = self._handles.get(alias)
        handle = wr() if wr is not None else None
        storage = getattr(handle, "_storage", None)
        b = _BorrowTrace(alias, storage, {alias})
        self._borrows[alias] = b
        self._name_borrow[alias] = b
        if storage is not None:
            self._borrowed[id(storage)] = b

    def _first_use(self, refs: Iterable[int]) -> None:
        """``BorrowFirstUse`` before the first command that uses a borrowed tensor."""
        for r in refs:
            b = self._borrows.get(r)
            if b is not None and not b.used:
                b.used = True
                self.sim.next_command("BorrowFirstUse")

    def _last_use(self, b: _BorrowTrace) -> None:
        if not b.used:  # Monarch marks a borrow used when its last tensor goes unused
            b.used = True
            self.sim.next_command("BorrowFirstUse")
        b.last = True
        self.sim.next_command("BorrowLastUse")

    def _borrow_dropped(self, alias: int) -> list[int]:
        """The ids the drop of ``alias``'s borrow ends (it and its views still held), after
        the messages Monarch's ``drop()`` sends before ``BorrowDrop``: it deletes each of
        them, and the last one's deletion is the borrow's last use."""
        b = self._borrows.pop(alias, None)
        if b is None:
            return [alias]
        if b.storage is not None:
            self._borrowed.pop(id(b.storage), None)
        names = sorted(b.names)
        for r in names:
            self._name_borrow.pop(r, None)
            self._ended.add(r)
        if not b.last:
            if len(names) > 1:
                self.sim.next_command("DeleteRefs")  # all but the last, before BorrowLastUse
            self._last_use(b)
            self.sim.next_command("DeleteRefs")
        return sorted({alias, *names})

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
        inputs = self._ref_ids(cmd.args) + self._ref_ids(cmd.kwargs)
        self._first_use(inputs)
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
            and self._shares_storage(outs[0], inputs[0])
        )
        if view_only:
            placed = sim.task(groups, stream, name, 0, traced=False)
            self._allocate(placed, outs, stream)
            return
        devices = {self._device(r) for r in outs + inputs}
        device = "cuda" if "cuda" in devices else "cpu"
        if name in ("aten._to_copy", "aten.copy_", "aten.to") and len(devices) > 1:
            nbytes = sum(self._spec[r].nbytes for r in inputs if r in self._spec)
            cost = self.costs.host_copy(nbytes)
        else:
            cost = self.costs.op(cmd.op, self._specs(cmd.args), self._specs(cmd.kwargs), device)
        placed = sim.task(groups, stream, name, _ns(cost), self._meta())
        self._allocate(placed, outs, stream)

    def _shares_storage(self, out: int, inp: int) -> bool:
        wo, wi = self._handles.get(out), self._handles.get(inp)
        ho = wo() if wo is not None else None
        hi = wi() if wi is not None else None
        return ho is not None and hi is not None and ho._storage is hi._storage

    def _subgroups(self, groups: tuple[tuple[int, ...], ...]) -> np.ndarray:
        key = id(groups)
        hit = self._sub.get(key)
        if hit is not None and hit[0] is groups:
            return hit[1]  # type: ignore[no-any-return]
        arr = np.array(groups, dtype=np.int64)
        self._sub[key] = (groups, arr)  # type: ignore[assignment]
        return arr

    def _components(self, sub: np.ndarray) -> list[list[WorkerGroup]]:
        """The worker groups that exchange data in a collective over the rows of ``sub``."""
        sim = self.sim
        mapping = sim._worker_group_mapping
        gids = mapping[sub]  # rows: subgroups; values: group index
        first = np.repeat(gids[:, :1], gids.shape[1], axis=1)
        pairs = np.unique(np.stack([first.ravel(), gids.ravel()], axis=1), axis=0)
        parent: dict[int, int] = {}

        def find(a: int) -> int:
            while parent.setdefault(a, a) != a:
                parent[a] = parent[parent[a]]
                a = parent[a]
            return a

        for a, b in pairs.tolist():
            ra, rb = find(a), find(b)
            if ra != rb:
                parent[ra] = rb
        comps: dict[int, list[WorkerGroup]] = {}
        for gid in sorted(parent):
            comps.setdefault(find(gid), []).append(sim.workers[gid])
        return list(comps.values())

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
        self._first_use(srcs)
        for _ in srcs:  # Monarch's controller sends one Reduce a tensor
            sim.next_command("Reduce")
        self._status_due = True
        self._groups(shape)  # split groups the collective treats differently
        sub = self._subgroups(cmd.groups)
        nbytes = sum(self._spec[s].nbytes for s in srcs if s in self._spec)
        cost = self._collective_cost(kind, nbytes, sub)
        placed = sim.synchronised(self._components(sub), stream, label, _ns(cost), self._meta())
        self._allocate(placed, outs, stream)

    def _collective_cost(self, kind: str, nbytes: int, sub: np.ndarray) -> float:
        if sub.shape[1] <= 1:
            return 0.0
        hosts = sub // self.gpus_per_host
        spans = bool((hosts.max(axis=1) != hosts.min(axis=1)).any())
        rep = sub[int(np.argmax(hosts.max(axis=1) != hosts.min(axis=1)))] if spans else sub[0]
        return self.costs.collective(kind, nbytes, [int(r) for r in rep])

    def _send_to(self, stream: str, cmd: SendTo) -> None:
        sim = self.sim
        if cmd.src is not None:
            self._first_use([cmd.src])
        sim.next_command("SendTensor")
        self._status_due = True
        spec = self._spec.get(cmd.src) if cmd.src is not None else None
        nbytes = spec.nbytes if spec is not None else math.prod(cmd.shape) * cmd.dtype.itemsize
        local = [(d, s) for d, s in cmd.pairs if d == s]
        remote = [(d, s) for d, s in cmd.pairs if d != s]
        placed: list[tuple[WorkerGroup, int, int]] = []
        if local:
            ranks = np.unique(np.array([d for d, _ in local], dtype=np.int64))
            cost = self.costs.op("aten::clone", (spec,), {}, "cuda") if spec else 0.0
            placed += sim.task(sim.groups_for(ranks), stream, "SendTensor", _ns(cost), self._meta())
        if remote:
            srcs = np.unique(np.array([s for _, s in remote], dtype=np.int64))
            dsts = np.unique(np.array([d for d, _ in remote], dtype=np.int64))
            src_groups = sim.groups_for(srcs)
            dst_groups = sim.groups_for(dsts)
            src_groups = sim.groups_for(srcs)  # a split for dsts may have renumbered them
            d, s = remote[0]
            cost = self.costs.send(nbytes, int(s), int(d))
            names = {id(g): "SendTensor" for g in src_groups}
            names.update({id(g): "RecvTensor" for g in dst_groups if id(g) not in names})
            comp = list({id(g): g for g in src_groups + dst_groups}.values())
            done = sim.synchronised([comp], stream, "SendTensor", _ns(cost), self._meta(), names)
            dst_ids = {id(g) for g in sim.groups_for(dsts)}
            placed += [p for p in done if id(p[0]) in dst_ids]
        if cmd.out is not None:
            self._allocate(placed, [cmd.out], stream)

    def _group_args(self, tree: Any) -> list[GroupArg]:
        found: list[GroupArg] = []

        def visit(x: Any) -> Any:
            if isinstance(x, GroupArg):
                found.append(x)
            return x

        pytree.tree_map(visit, tree, is_leaf=_is_ref)
        return found

    def _remote(
        self, shape: Shape, stream: str, cmd: RunRemote, message: str | None = None
    ) -> None:
        """A remote function; the controller's trace names it (Monarch's ``CallFunction``)
        unless ``message`` names the message that carries it."""
        sim = self.sim
        name = target_name(cmd.fn)
        self._first_use(self._ref_ids(cmd.args) + self._ref_ids(cmd.kwargs))
        sim.next_command(message or name)
        self._status_due = True
        groups = self._groups(shape)
        args, kwargs = self._specs(cmd.args), self._specs(cmd.kwargs)
        pgs = self._group_args((cmd.args, cmd.kwargs)) if cmd.groups else []
        fn = None if pgs else _resolve(cmd.fn)
        cost = self.costs.remote(name, args, kwargs, fn)
        outs = [r for r in cmd.outs if r is not None]
        if pgs:
            # a function given a process group runs its collectives with the group: its
            # members start together, and it moves its tensor arguments once around it
            sub = self._subgroups(pgs[0].groups)
            leaves = pytree.tree_leaves(args, is_leaf=_is_ref)
            nbytes = sum(s.nbytes for s in leaves if isinstance(s, TensorSpec))
            cost += self._collective_cost("all_reduce", nbytes, sub)
            placed = sim.synchronised(self._components(sub), stream, name, _ns(cost), self._meta())
        else:
            placed = sim.task(groups, stream, name, _ns(cost), self._meta())
        self._allocate(placed, outs, stream)

    # -- values back to the controller -----------------------------------------------------

    def fetch(self, shape: Shape, ids: list[int]) -> list[Any]:
        """Zeros shaped like ``ids``; the controller's clock moves to when they arrive."""
        with self._lock:
            self._drain()
            sim = self.sim
            self._first_use(ids)
            sim.next_command("SendValue")
            nbytes = sum(self._spec[r].nbytes for r in ids if r in self._spec)
            cost = self.costs.host_copy(nbytes)
            placed = sim.task(self._groups(shape), "main", "fetch_shard", _ns(cost), self._meta())
            if placed:
                sim.now = max(sim.now, max(end for _g, _s, end in placed))
            self._status()
            return [self._zeros(r) for r in ids]

    def _status(self) -> None:
        """Monarch's controller asks for the workers' status after a fetch, and the value
        it waits for answers it."""
        self.sim.next_command("RequestStatus")
        self._status_due = False

    def _zeros(self, ref: int) -> torch.Tensor:
        spec = self._spec.get(ref)
        with _disable_current_modes():
            if spec is None:
                return torch.zeros((), device="cpu")
            return torch.zeros(spec.shape, dtype=spec.dtype, device="cpu")

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
                return self._zeros(x.id) if isinstance(x, Ref) else x

            real = pytree.tree_map(zero, args, is_leaf=_is_ref)
            kw = pytree.tree_map(zero, kwargs, is_leaf=_is_ref)
            try:
                value = _resolve(fn)(*real, **kw)
            except Exception:
                value = None
        return [value] * len(shape.ranks())
