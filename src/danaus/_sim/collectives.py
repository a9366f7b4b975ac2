"""Collectives and point-to-point sends on simulated workers: which worker groups a
collective joins (those that exchange data over its process groups' rows) and what it
costs (the cost model's price for the row that crosses hosts, when one does); a send's
placing on its sources and destinations, and its cost."""

from __future__ import annotations

from typing import Any

import numpy as np
from torch.utils import _pytree as pytree

from .._tensor.messages import GroupArg
from .core import Simulator, WorkerGroup
from .costs import CostModel, TensorSpec
from .refs import _is_ref, _ns


class Collectives:
    """Prices and places collectives for one engine's ``sim``."""

    def __init__(self, sim: Simulator, costs: CostModel, gpus_per_host: int) -> None:
        self.sim = sim
        self.costs = costs
        self.gpus_per_host = gpus_per_host
        self._sub: dict[int, tuple[Any, np.ndarray]] = {}  # id(groups) -> (them, array)

    def subgroups(self, groups: tuple[tuple[int, ...], ...]) -> np.ndarray:
        """A command's process groups (rows of ranks) as an array, cached by identity."""
        key = id(groups)
        hit = self._sub.get(key)
        if hit is not None and hit[0] is groups:
            return hit[1]
        arr = np.array(groups, dtype=np.int64)
        self._sub[key] = (groups, arr)
        return arr

    def components(self, sub: np.ndarray) -> list[list[WorkerGroup]]:
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

    def cost(self, kind: str, nbytes: int, sub: np.ndarray) -> float:
        """Seconds for collective ``kind`` of ``nbytes`` over the rows of ``sub``."""
        if sub.shape[1] <= 1:
            return 0.0
        hosts = sub // self.gpus_per_host
        spans = bool((hosts.max(axis=1) != hosts.min(axis=1)).any())
        rep = sub[int(np.argmax(hosts.max(axis=1) != hosts.min(axis=1)))] if spans else sub[0]
        return self.costs.collective(kind, nbytes, [int(r) for r in rep])

    def send(
        self,
        stream: str,
        pairs: Any,
        spec: TensorSpec | None,
        nbytes: int,
        meta: tuple[Any, ...],
    ) -> list[tuple[WorkerGroup, int, int]]:
        """Simulate a send of ``nbytes`` (a tensor like ``spec``) for each (destination,
        source) rank of ``pairs``: a copy where they are one rank, a transfer the sources
        and destinations take part in together otherwise. The destinations' placings."""
        sim = self.sim
        local = [(d, s) for d, s in pairs if d == s]
        remote = [(d, s) for d, s in pairs if d != s]
        placed: list[tuple[WorkerGroup, int, int]] = []
        if local:
            ranks = np.unique(np.array([d for d, _ in local], dtype=np.int64))
            cost = self.costs.op("aten::clone", (spec,), {}, "cuda") if spec else 0.0
            placed += sim.task(sim.groups_for(ranks), stream, "SendTensor", _ns(cost), meta)
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
            done = sim.synchronised([comp], stream, "SendTensor", _ns(cost), meta, names)
            dst_ids = {id(g) for g in sim.groups_for(dsts)}
            placed += [p for p in done if id(p[0]) in dst_ids]
        return placed


def group_args(tree: Any) -> list[GroupArg]:
    """The process groups passed in ``tree`` (a remote function's arguments)."""
    found: list[GroupArg] = []

    def visit(x: Any) -> Any:
        if isinstance(x, GroupArg):
            found.append(x)
        return x

    pytree.tree_map(visit, tree, is_leaf=_is_ref)
    return found
