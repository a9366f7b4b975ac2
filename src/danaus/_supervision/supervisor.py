"""``Supervisor``: OTP's restart strategies over actor meshes (``danaus.supervisor``).

A supervisor spawns its children (actor meshes) and restarts the ranks that
fail, instead of telling their owner:

    failure of mesh[r] (FAILED frame, or its proc lost)     I/O thread
        -> monitor asks supervised.intercept(): ours         the ranks the strategy
                                                             restarts are held: calls
                                                             made from now on wait
        -> the supervisor's thread: intensity? backoff,      one thread per tree of
           stop the healthy ranks to restart, place each      supervisors
           rank (same proc / new proc on its host / spare
           host), SPAWN under the same (mesh id, rank)
        -> the held calls are sent, in order, behind SPAWN

Every rank keeps its address ``(mesh id, rank)``: a rank restarted in its own
proc replaces its dead actor there (``procservice`` lets a SPAWN replace a
stopped or failed actor), so the handle and the copies of it other actors
hold keep working. A rank moved to another proc is reached through the handle
the supervisor returned (it reads the current procs); copies sent before the
move still name the old proc.

More than ``max_restarts`` restarts within ``period`` seconds: the
supervisor stops its children and gives up. A top-level supervisor tells its
owner (a ``MeshFailure`` to the owning actor's ``__supervise__``, or the
client's ``unhandled_fault_hook``); a nested one is a failed child of its
parent, which applies its own strategy to it.
"""

from __future__ import annotations

import collections
import concurrent.futures
import functools
import logging
import secrets
import threading
import time
from typing import Any, TypeVar

from .. import _config as config
from .._actor.api.actor import actor_mode, validate_actor_class
from .._actor.api.mesh import MeshRef, _State
from .._actor.api.procs import ProcMesh
from .._actor.core import owned
from .._actor.core.context import Context, acting_as, context
from .._actor.core.future import Future
from .._mesh import Shape, Slice
from .._runtime.logs.dirs import NOTIFY
from .._runtime.node import Node
from .._wire import codec
from .._wire.ids import ProcId
from . import monitor
from .child import _MeshChild, spawn_ranks, stop_ranks
from .failure import MeshFailure
from .handle import SupervisedMesh
from .placement import Placer
from .policy import Backoff, Restart, checked, retry_delay
from .supervised import Supervised
from .tree import _Tree

__all__ = ["Backoff", "Restart", "Supervisor"]

log = logging.getLogger("danaus.supervision")

A = TypeVar("A")


class Supervisor:
    """Restarts the actors it spawns when they fail, as Erlang/OTP's supervisors do.

    ``strategy``: ``"one_for_one"`` restarts only the failed ranks;
    ``"one_for_all"`` every rank of every child; ``"rest_for_one"`` the failed
    child (all its ranks) and every child spawned after it. More than
    ``max_restarts`` restarts within ``period`` seconds and the supervisor
    stops its children and gives up: its owner (the actor that made it, or the
    client) gets a ``MeshFailure`` saying so. ``backoff``: a [`Backoff`][danaus.supervisor.Backoff]
    or ``(initial, cap)`` seconds to wait before each restart, doubling.
    ``spare_hosts``: a ``HostMesh`` whose hosts take the ranks of a host that
    is gone. ``name`` names it in failures, logs and ``danaus top``.
    """

    def __init__(
        self,
        strategy: str = "one_for_one",
        max_restarts: int = 3,
        period: float = 60.0,
        backoff: Backoff | tuple[float, float] | None = None,
        spare_hosts: Any = None,
        name: str = "supervisor",
    ) -> None:
        backoff = checked(strategy, max_restarts, period, backoff, spare_hosts, name)
        self.strategy = strategy
        self.max_restarts = max_restarts
        self.period = float(period)
        self.backoff: Backoff | None = backoff
        self.name = name
        ctx = context()
        self._node = ctx.actor_instance._home()  # the owner's: a failure it gives up on goes there
        self._ctx = Context(ctx.actor_instance, ctx.message_rank)  # the owner
        self._owner = ctx.actor_instance.actor_id
        self._parent: Supervisor | None = None
        self._tree = _Tree(name)
        self._children: list[_MeshChild | Supervisor] = []
        self._lock = threading.Lock()  # guards _children, _restarts, _history, _failures
        self._restarts: list[Restart] = []
        self._history: collections.deque[float] = collections.deque()  # monotonic times
        self._failures: collections.deque[tuple[float, str]] = collections.deque()
        self._generation = 0  # restarts of this supervisor by its parent
        self._status = "running"  # "gave up", "stopped"
        self._placer = Placer(name, spare_hosts)  # where restarted ranks go
        self._stop_event = threading.Event()
        self._unplaced_tries = 0  # tries in a row that found no host for some rank
        reg = self._node.part(Supervised)
        with reg.lock:
            reg.supervisors.append(self)

    # -- public ---------------------------------------------------------------------------

    @property
    def restarts(self) -> list[Restart]:
        """Every restart made so far, oldest first."""
        with self._lock:
            return list(self._restarts)

    @property
    def status(self) -> str:
        """``"running"``, ``"gave up"`` or ``"stopped"``."""
        return self._status

    @property
    def children(self) -> list[Any]:
        """The child meshes' handles and nested supervisors, in spawn order."""
        with self._lock:
            return [c.handle if isinstance(c, _MeshChild) else c for c in self._children]

    def spawn(self, procs: ProcMesh, name: str, Class: type[A], *args: Any, **kwargs: Any) -> A:
        """Spawn ``Class(*args, **kwargs)`` on every proc of ``procs``, supervised.

        As ``procs.spawn(name, Class, ...)``: returns the ``ActorMesh`` at once.
        The handle stays valid across restarts.
        """
        if not isinstance(procs, ProcMesh):
            raise TypeError(f"spawn(procs, name, Class, ...) needs a ProcMesh, got {procs!r}")
        if not isinstance(name, str) or not name:
            raise TypeError(f"spawn() needs a non-empty string name, got {name!r}")
        self._check_running()
        eps = validate_actor_class(Class)
        mode = actor_mode(Class, eps)
        with acting_as(self._ctx):
            creator = context().actor_instance
            body = codec.dumps_checked(
                (Class, args, kwargs, name, creator), f"the class or arguments of actor {name!r}"
            )
        ext = procs._shape.extent
        shape = Shape(list(ext.labels), Slice.new_row_major(list(ext.sizes)))
        mesh_id = f"{name}.{secrets.token_hex(3)}"
        ref = MeshRef(mesh_id, name, Class, tuple(procs._selected()), self._owner)
        state = _State(initialized=concurrent.futures.Future(), node=procs._node())
        child = _MeshChild(ref, state, shape)
        child.body, child.mode = body, mode
        handle: SupervisedMesh[Any] = SupervisedMesh(child, shape)
        child.handle = handle
        with self._lock:
            self._children.append(child)
        self._node.part(Supervised).watch(mesh_id, functools.partial(self._on_failure, child))
        owned.register_actor_mesh(child.node, handle)
        self._spawn(child, {r: p for r, p in enumerate(ref.procs)})
        return handle  # type: ignore[return-value]

    def supervisor(
        self,
        strategy: str = "one_for_one",
        max_restarts: int = 3,
        period: float = 60.0,
        backoff: Backoff | tuple[float, float] | None = None,
        spare_hosts: Any = None,
        name: str = "supervisor",
    ) -> Supervisor:
        """A child supervisor: one child of this one, in spawn order. When it gives up,
        this supervisor applies its own strategy to it (restarting all it spawned)."""
        self._check_running()
        child = Supervisor(
            strategy, max_restarts, period, backoff,
            spare_hosts if spare_hosts is not None else self.spare_hosts, name,
        )  # fmt: skip
        child._ctx, child._owner = self._ctx, self._owner
        child._parent = self
        child._tree = self._tree
        with self._lock:
            self._children.append(child)
        return child

    def stop(self, reason: str = "stopped by its supervisor's owner") -> Future[None]:
        """Stop every child and the procs restarts made; restart nothing more."""
        self._stop_children(reason, final=True, status="stopped")
        if self._parent is None:
            self._tree.end()
        return Future._resolved(None, f"stopping supervisor {self.name!r}")

    @property
    def spare_hosts(self) -> Any:
        """The ``HostMesh`` whose hosts take the ranks of a lost host (None: none).

        May be set while the supervisor runs (a host back from a partition, attached
        again, becomes a spare): the next restart places ranks there.
        """
        return self._placer.spare_hosts

    @spare_hosts.setter
    def spare_hosts(self, hosts: Any) -> None:
        self._placer.spare_hosts = hosts

    def __repr__(self) -> str:
        return (
            f"<Supervisor {self.name!r} {self.strategy} max_restarts={self.max_restarts} "
            f"period={self.period} {self._status}, {len(self._children)} children>"
        )

    # -- what the dashboard shows ----------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        with self._lock:
            children = list(self._children)
            restarts = [r.as_dict() for r in self._restarts]
        return {
            "name": self.name,
            "strategy": self.strategy,
            "max_restarts": self.max_restarts,
            "period": self.period,
            "status": self._status,
            "parent": self._parent.name if self._parent is not None else None,
            "children": [c.name for c in children],
            "restarts": restarts,
        }

    # -- failures (I/O thread) -------------------------------------------------------------

    def _check_running(self) -> None:
        if self._status != "running":
            raise RuntimeError(f"supervisor {self.name!r} has {self._status}; make a new one")

    def _on_failure(self, child: _MeshChild, rank: int, reason: str, tb: str, tail: Any) -> bool:
        """A rank of ``child`` failed: hold what the strategy restarts, queue the restart."""
        if child.stopped or self._status != "running":
            return False  # its owner hears, as for any mesh
        now = time.time()
        held = self._affected(child, {rank})
        tree = self._tree
        with tree.lock:
            for c, ranks in held.items():
                c.block(ranks)
            tree.events.append((self, child, {rank: child.incarnation[rank]}, reason, now))
            tree.start_locked()
            tree.wake.notify()
        return True

    def _child_gave_up(self, sub: Supervisor, reason: str) -> None:
        held = self._affected(sub, set())
        tree = self._tree
        with tree.lock:
            for c, ranks in held.items():
                c.block(ranks)
            tree.events.append((self, sub, {-1: sub._generation}, reason, time.time()))
            tree.wake.notify()

    def _picked(self, child: Any) -> list[Any]:
        """The children this supervisor's strategy restarts when ``child`` fails."""
        with self._lock:
            children = list(self._children)
        if self.strategy == "one_for_all":
            return children
        if self.strategy == "rest_for_one" and child in children:
            return children[children.index(child) :]
        return [child]

    def _affected(self, child: Any, ranks: set[int]) -> dict[_MeshChild, set[int]]:
        """The mesh children and ranks this supervisor's strategy restarts for a failure
        of ``ranks`` of ``child`` (a nested supervisor restarts as a whole)."""
        # Only one_for_one restarts the failed ranks alone. The others restart every
        # rank of what they pick, even when that is just the failed child (one_for_all
        # with one child, rest_for_one when the last child fails).
        if self.strategy == "one_for_one" and isinstance(child, _MeshChild):
            return {child: set(ranks)}
        picked = self._picked(child)
        out: dict[_MeshChild, set[int]] = {}
        for c in picked:
            for m in c.mesh_children():
                if not m.stopped:
                    out[m] = set(range(m.size))
        return out

    def mesh_children(self) -> list[_MeshChild]:
        with self._lock:
            children = list(self._children)
        return [m for c in children for m in c.mesh_children()]

    # -- spawning, and what the tree's thread calls ----------------------------------------

    def _spawn(self, m: _MeshChild, placements: dict[int, ProcId]) -> None:
        """Spawn ranks of ``m`` where ``placements`` says; one lost before it is up
        fails as any failure does."""
        spawn_ranks(
            m, placements, self._owner, lambda m, r, why: self._on_failure(m, r, why, "", ())
        )

    def _release_root(self) -> None:
        """The tree's thread is idle: no rank of the whole tree waits any longer."""
        self._root()._release_all()

    def _root(self) -> Supervisor:
        s = self
        while s._parent is not None:
            s = s._parent
        return s

    def _release_all(self) -> None:
        for m in self.mesh_children():
            if m.blocked:
                m.release()

    def _stale(self, child: Any, incarnations: dict[int, int]) -> bool:
        if isinstance(child, Supervisor):
            return child._generation != incarnations.get(-1) or child._status == "stopped"
        return child.stopped or all(child.incarnation[r] != n for r, n in incarnations.items())

    def _handle(
        self,
        child: Any,
        incarnations: dict[int, int],
        reason: str,
        failed_at: float,
        retry: bool = False,
    ) -> None:
        """Restart what a failure of ``child``'s ranks (``incarnations``: rank -> the
        incarnation that failed) calls for; ``retry``: place again ranks no host took
        (only them: what the strategy restarted with them is up already)."""
        if self._status != "running" or self._stale(child, incarnations):
            return
        ranks = {r for r, n in incarnations.items() if r >= 0}
        if retry:
            ranks = {r for r in ranks if r in child.state.failed}
            if not ranks:
                return
        what = f"{child.name}{sorted(ranks)}" if ranks else child.name
        now = time.monotonic()
        with self._lock:
            while self._history and now - self._history[0] > self.period:
                self._history.popleft()
            while self._failures and now - self._failures[0][0] > self.period:
                self._failures.popleft()
            self._failures.append((now, f"{what}: {reason}"))
            earlier = len(self._history)
            exceeded = earlier >= self.max_restarts
            failures = [f for _, f in self._failures]
        if exceeded:
            self._give_up(failures)
            return
        delay = self.backoff.delay(earlier) if self.backoff is not None else 0.0
        if delay and self._tree.ended.wait(delay):
            return
        if retry:
            targets = {child: ranks}
        else:
            # Failures that arrived meanwhile and that this restart covers are not
            # restarted again.
            targets = self._affected(child, ranks)
            for c in self._picked(child):
                if isinstance(c, Supervisor) and c._status != "stopped":
                    c._revive()  # a restarted supervisor starts afresh
        unplaced = self._restart(targets, reason)
        with self._lock:
            self._history.append(time.monotonic())  # a try that placed nothing counts too
        if unplaced:
            self._retry_later(unplaced, reason, failed_at)
        else:
            self._unplaced_tries = 0
        done = {m: rs - unplaced.get(m, set()) for m, rs in targets.items()}
        done = {m: rs for m, rs in done.items() if rs}
        if not done:
            return  # nothing was restarted: no record
        if isinstance(child, _MeshChild):
            ranks -= unplaced.get(child, set())
        rec = Restart(
            time.time(), child.name, tuple(sorted(ranks)) if ranks else (), reason,
            delay, failed_at, self.name,
        )  # fmt: skip
        _announce(
            self._node, self.name, rec, done
        )  # before it is listed: whoever sees it can find the log
        with self._lock:
            self._restarts.append(rec)

    def _retry_later(
        self, unplaced: dict[_MeshChild, set[int]], reason: str, failed_at: float
    ) -> None:
        """No host took ``unplaced``: they stay failed (calls to them fail with
        ``SupervisionError`` saying so) and are placed again after a backoff that
        doubles from ``restart_retry_initial`` to ``restart_retry_cap`` (not a tight
        loop of tries while no host is free); each try counts toward the intensity."""
        delay = retry_delay(
            self._unplaced_tries,
            config.get("restart_retry_initial"),
            config.get("restart_retry_cap"),
        )
        self._unplaced_tries += 1
        tree = self._tree
        for m, ranks in unplaced.items():
            why = (
                f"{reason} (no host could take it: its host is gone and no spare host "
                f"did; supervisor {self.name!r} tries again in {delay:.1f} s)"
            )
            with m.state.lock:
                for r in ranks:
                    m.state.failed[r] = why
            event = (self, m, {r: m.incarnation[r] for r in ranks}, reason, failed_at, True)
            with tree.lock:
                tree.later_locked(delay, event)
        log.warning(
            "supervisor %r: no host for %s; trying again in %.1f s", self.name,
            ", ".join(f"{m.name}{sorted(r)}" for m, r in unplaced.items()), delay,
        )  # fmt: skip

    # -- restarting ------------------------------------------------------------------------

    def _restart(
        self, targets: dict[_MeshChild, set[int]], reason: str
    ) -> dict[_MeshChild, set[int]]:
        """Stop the healthy ones of ``targets``, spawn each rank again, release its calls.
        Returns the ranks no host could take: they stay failed, and their held calls
        are released to fail at once (none waits for a host that may never come)."""
        unplaced: dict[_MeshChild, set[int]] = {}
        timeout = config.get("shutdown_timeout")
        stopping = []
        for m, ranks in targets.items():
            healthy = [r for r in sorted(ranks) if r not in m.state.failed]
            why = f"restarted by supervisor {self.name!r}"
            stopping.append(stop_ranks(m.node, m.ref, healthy, why))
        for f in stopping:
            try:
                f.result(timeout)
            except Exception as e:
                log.warning("supervisor %r: a stop before a restart failed: %r", self.name, e)
        for m, ranks in targets.items():
            if m.stopped:
                continue
            placements, missing = self._placer.place(m, ranks, self._ctx)
            with m.state.lock:
                for r in placements:
                    m.incarnation[r] += 1
                    m.state.failed.pop(r, None)
                    m.state.tracebacks.pop(r, None)
            m.state.stopped = False
            self._spawn(m, placements)
            if missing:
                unplaced[m] = missing
            m.release(set(ranks))
        return unplaced

    # -- stopping and giving up --------------------------------------------------------------

    def _revive(self) -> None:
        """This (nested) supervisor is restarted by its parent: a fresh start."""
        with self._lock:
            self._history.clear()
            self._failures.clear()
            self._generation += 1
            self._status = "running"
        for sub in self._children_supervisors():
            sub._revive()

    def _stop_children(self, reason: str, *, final: bool, status: str) -> None:
        """Stop every child mesh. ``final``: for good (calls fail at once); else the
        parent will restart them, and calls wait for that."""
        self._status = status
        meshes = self.mesh_children()
        for m in meshes:
            if final:
                m.state.stopped = True
            else:
                m.block(set(range(m.size)))
        stopping = [
            stop_ranks(m.node, m.ref, list(range(m.size)), reason) for m in meshes if not m.stopped
        ]
        for f in stopping:
            try:
                f.result(config.get("shutdown_timeout"))
            except Exception as e:
                log.warning("supervisor %r: a child did not stop cleanly: %r", self.name, e)
        for m in meshes:
            if final:
                m.retire()
                owned.forget(m.node, m.ref.mesh_id)
        if final:
            for sub in self._children_supervisors():
                sub._status = status
            self._placer.stop_procs(reason)

    def _children_supervisors(self) -> list[Supervisor]:
        with self._lock:
            subs = [c for c in self._children if isinstance(c, Supervisor)]
        return [s for sub in subs for s in (sub, *sub._children_supervisors())]

    def _give_up(self, failures: list[str], why: str | None = None) -> None:
        reason = why or (
            f"supervisor {self.name!r} gave up: restart intensity exceeded (more than "
            f"{self.max_restarts} restarts within {self.period:g} s); it stopped its "
            f"children. Failures: " + "; ".join(failures)
        )
        log.error("%s", reason)
        if self._parent is not None:
            self._stop_children(reason, final=False, status="gave up")
            self._parent._child_gave_up(self, reason)
            return
        self._stop_children(reason, final=True, status="gave up")
        failure = MeshFailure(self.name, [], reason, "", self)
        with acting_as(self._ctx):
            monitor.deliver(self._node, self._owner, failure)
        self._tree.end()

    def _end_quietly(self) -> None:
        self._status = "stopped"
        self._tree.end()


def _announce(node: Node, name: str, rec: Restart, targets: dict[_MeshChild, set[int]]) -> None:
    """Log and trace one restart."""
    moved = ", ".join(f"{m.name}{sorted(r)}" for m, r in targets.items())
    log.warning(
        "supervisor %r restarted %s (%s) after: %s",
        name,
        rec.child,
        moved,
        rec.reason,
        extra={NOTIFY: True},  # the user hears of it in the terminal, once
    )
    tracer = node.runtime.tracer
    if tracer is not None:
        t0 = tracer.now() - int((rec.time - rec.failed_at) * 1e9)
        tracer.span(
            f"restart {rec.child}",
            "supervision",
            t0,
            {"supervisor": name, "ranks": list(rec.ranks), "reason": rec.reason,
             "delay_s": rec.delay, "restarted": moved},
        )  # fmt: skip
