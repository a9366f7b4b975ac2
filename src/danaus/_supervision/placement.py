"""Where a supervisor's restarted ranks go: their own proc if it lives, else a new proc
on their host, else a spare host's; and the procs it spawned for them."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from .. import _config as config
from .._actor.api.procs import ProcMesh, spawn_on
from .._actor.core import owned
from .._actor.core.context import Context, acting_as
from .._mesh import Shape
from .._runtime.hosting import host
from .._runtime.logs.process import LogControl
from .._runtime.node import Node
from .._wire.ids import ProcId
from .child import _MeshChild

log = logging.getLogger("danaus.supervision")


class Placer:
    """A supervisor's placement of ranks: the spare hosts it tries in turn and the procs
    it spawned (stopped with it)."""

    def __init__(self, name: str, spare_hosts: Any) -> None:
        self.name = name
        self.spare_hosts = spare_hosts
        self._spare_next = 0
        self.procs: list[ProcMesh] = []  # the procs restarts spawned (stopped with us)

    def place(
        self, m: _MeshChild, ranks: set[int], ctx: Context
    ) -> tuple[dict[int, ProcId], set[int]]:
        """Where each rank goes: its proc if alive, else a new proc on its host, else a
        spare host's (spawned as ``ctx``). Updates the child's procs. Returns the
        placements and the ranks no host could take (their procs are unchanged)."""
        node = m.node
        rt = node.runtime
        logs = node.part(LogControl)
        self._forget_gone(rt)
        procs = list(m.ref.procs)
        by_agent: dict[ProcId | None, list[int]] = {}
        unplaced: set[int] = set()
        for r in sorted(ranks):
            p = procs[r]
            if not rt.peers.is_lost(p.name) and p.name not in rt.peers.exited:
                continue
            agent = logs.agents.get(p.name)
            lost_agent = agent is not None and (
                rt.peers.is_lost(agent.name) or (agent.name in rt.peers.exited)
            )
            by_agent.setdefault(None if lost_agent else (agent or host.agent(node)), []).append(r)
        for agent, rs in by_agent.items():
            new = self._new_procs(node, agent, len(rs), m.name, ctx) if agent is not None else None
            if new is None:
                new = self._spare_procs(len(rs), m.name, ctx)
            if new is None:
                log.warning(
                    "supervisor %r: no host to restart %s%s on (their host is gone and "
                    "no spare host took them)", self.name, m.name, rs,
                )  # fmt: skip
                unplaced.update(rs)
                continue
            for r, p in zip(rs, new, strict=True):
                procs[r] = p
        if tuple(procs) != m.ref.procs:
            m.ref = replace(m.ref, procs=tuple(procs))
            om = owned.get(m.node, m.ref.mesh_id)
            if om is not None:
                om.ref = m.ref
        return {r: procs[r] for r in ranks if r not in unplaced}, unplaced

    def _forget_gone(self, rt: Any) -> None:
        """Let go of the procs restarts spawned that are all gone now: a replacement
        lost in turn is released here and in the node's and the owner's registries, so
        a long run of faults holds only the procs that still live. (Not ``stop()``,
        which would forget the child meshes that ran there, about to be placed anew.)"""
        live: list[ProcMesh] = []
        gone: list[ProcMesh] = []
        for pm in self.procs:
            dead = all(rt.peers.is_lost(p.name) or p.name in rt.peers.exited for p in pm._procs)
            (gone if dead else live).append(pm)
        if not gone:
            return
        self.procs = live
        for pm in gone:
            pm._let_go()

    def _new_procs(
        self, node: Node, agent: ProcId | None, n: int, name: str, ctx: Context
    ) -> list[ProcId] | None:
        try:
            with acting_as(ctx):
                pm = spawn_on(node, [agent], {"procs": n}, Shape.unity(), None, name, None)
            self.procs.append(pm)
            pm.initialized.get(timeout=config.get("worker_start_timeout"))
        except Exception as e:
            log.warning("supervisor %r: no new proc on host agent %s: %r", self.name, agent, e)
            return None
        return list(pm._procs)

    def _spare_procs(self, n: int, name: str, ctx: Context) -> list[ProcId] | None:
        spares = self.spare_hosts
        if spares is None:
            return None
        flat = spares.flatten("spare_hosts")
        size = len(flat)
        for _ in range(size):
            i = self._spare_next % size
            self._spare_next += 1
            try:
                with acting_as(ctx):
                    pm = flat.slice(spare_hosts=i).spawn_procs(per_host={"procs": n}, name=name)
                self.procs.append(pm)
                pm.initialized.get(timeout=config.get("worker_start_timeout"))
            except Exception as e:
                log.warning("supervisor %r: spare host %d refused procs: %r", self.name, i, e)
                continue
            return list(pm._procs)
        return None

    def stop_procs(self, reason: str) -> None:
        """Stop the procs restarts spawned, and forget them."""
        procs, self.procs = self.procs, []
        for pm in procs:
            try:
                pm.stop(reason).get(timeout=config.get("shutdown_timeout"))
            except Exception as e:
                log.warning("supervisor %r: procs did not stop cleanly: %r", self.name, e)
