"""An actor mesh a supervisor spawned (``_MeshChild``): its ranks' calls held while
they restart, its readiness, and how its ranks are spawned and stopped."""

from __future__ import annotations

import collections
import concurrent.futures
import functools
import logging
import threading
from collections.abc import Callable
from typing import Any

from .._actor.api.mesh import MeshRef, _State
from .._actor.core.collect import Collector, Countdown, set_future
from .._errors import SupervisionError
from .._mesh import Shape
from .._runtime.node import Node
from .._wire.ids import ActorId, ProcId
from .._wire.protocol import Spawn, StopActor
from . import monitor
from .supervised import Supervised

log = logging.getLogger("danaus.supervision")


class _Thunk:
    """A call held while ranks it targets restart: sent, in order, once they are up."""

    __slots__ = ("ranks", "run")

    def __init__(self, ranks: frozenset[int], run: Callable[[], None]) -> None:
        self.ranks = ranks
        self.run = run


class _MeshChild:
    """An actor mesh a supervisor spawned: how to spawn each rank again, and its calls."""

    def __init__(self, ref: MeshRef, state: _State, shape: Shape) -> None:
        self.ref = ref
        self.state = state
        self.shape = shape
        self.name = ref.name
        self.body: Any = None  # the pickled (class, args, kwargs, name, creator)
        self.mode = "sync"
        self.incarnation = [0] * len(ref.procs)
        self.lock = threading.Lock()  # guards held, blocked and pending
        self.blocked: set[int] = set()  # ranks being restarted
        self.held: frozenset[int] = frozenset()  # blocked + the ranks of pending calls
        self.pending: collections.deque[_Thunk] = collections.deque()
        self.stopped = False  # stopped by its user or for good: never restarted
        self.handle: Any = None  # its SupervisedMesh
        # Every rank has had an actor whose __init__ ran (``initialized``): the future and
        # the ranks up so far (under ``lock``).
        self.ready: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self.up: set[int] = set()

    @property
    def size(self) -> int:
        return len(self.ref.procs)

    def mesh_children(self) -> list[_MeshChild]:
        return [self]

    # calls ---------------------------------------------------------------------------

    def block(self, ranks: set[int]) -> None:
        with self.lock:
            self.blocked |= ranks
            self.held = frozenset(self.held | ranks)

    def hold(self, ranks: frozenset[int], run: Callable[[], None]) -> bool:
        """Queue ``run`` if ``ranks`` must wait for a restart; False: send it now."""
        with self.lock:
            if self.held.isdisjoint(ranks):
                return False
            self.pending.append(_Thunk(ranks, run))
            self.held = frozenset(self.held | ranks)
            return True

    def release(self, ranks: set[int] | None = None) -> None:
        """``ranks`` (all when None) are up: send the held calls that no longer wait, in
        the order they were made. They are sent without the lock (a send may wait for
        the I/O thread, which blocks ranks under it); until then ``held`` still covers
        their ranks, so a call made meanwhile queues behind them."""
        with self.lock:
            self.blocked = set() if ranks is None else self.blocked - ranks
        while True:
            with self.lock:
                waiting = set(self.blocked)
                kept: collections.deque[_Thunk] = collections.deque()
                runnable = []
                for t in self.pending:
                    if waiting.isdisjoint(t.ranks):
                        runnable.append(t)
                    else:
                        kept.append(t)
                        waiting |= t.ranks
                self.pending = kept
                if not runnable:
                    self.held = frozenset(waiting)
                    return
            for t in runnable:
                try:
                    t.run()
                except Exception:  # each thunk completes its own future; never ours
                    log.exception("a call held for a restart of %s failed", self.name)

    # readiness and retirement --------------------------------------------------------

    def initialized(self, rank: int) -> None:
        """Actor ``rank`` ran its ``__init__``: when every rank has, the mesh is ready."""
        with self.lock:
            self.up.add(rank)
            done = len(self.up) == self.size
        if done:
            set_future(self.ready, True, None)
            if self.state.initialized is not None:
                set_future(self.state.initialized, True, None)

    @property
    def node(self) -> Node:
        """The node this mesh belongs to: its proc mesh's (the supervisor sets it)."""
        node = self.state.node
        assert node is not None, f"supervised mesh {self.name!r} was made without its node"
        return node

    def retire(self) -> None:
        """Stopped by its user: never restarted, and what waits for it fails."""
        self.stopped = True
        self.state.stopped = True
        self.node.part(Supervised).forget(self.ref.mesh_id)
        self.release()  # held calls now hear that the mesh was stopped
        err = SupervisionError(
            f"actor mesh {self.name!r} was stopped", actor=self.name, reason="stopped"
        )
        set_future(self.ready, False, err)


def stop_ranks(
    node: Node, ref: MeshRef, ranks: list[int], reason: str
) -> concurrent.futures.Future[Any]:
    """Stop actors ``ranks`` of ``ref`` (a mesh of ``node``'s) directly (a dead proc
    counts as stopped)."""
    rt = node.runtime
    cf: concurrent.futures.Future[Any] = concurrent.futures.Future()
    if not ranks:
        cf.set_result(None)
        return cf
    countdown = Countdown(len(ranks), lambda: set_future(cf, True, None))
    collector = Collector(
        rt, f"{ref.name}.stop()", len(ranks), lambda i, ok, v: countdown.tick(), lost_is_ok=True
    )
    for index, rank in enumerate(ranks):
        collector.expect(index, ref.procs[rank])
    for index, rank in enumerate(ranks):
        rt.send(
            ref.procs[rank],
            StopActor(ref.mesh_id, rank, collector.port, index, reason),
            on_fail=functools.partial(collector.fail, index),
        )
    return cf


def spawn_ranks(
    m: _MeshChild,
    placements: dict[int, ProcId],
    owner: ActorId,
    failed: Callable[[_MeshChild, int, str], object],
) -> None:
    """Send SPAWN for each rank of ``m`` to its proc; calls sent after this queue behind
    it. A rank whose proc is lost before its actor is up is reported to ``failed``."""
    if not placements:
        return
    rt = m.node.runtime
    labels = tuple(m.shape.extent.labels)
    sizes = tuple(m.shape.extent.sizes)
    body, bufs = m.body
    ranks = sorted(placements)
    gen = {r: m.incarnation[r] for r in ranks}

    def on_value(rank: int, ok: bool, value: Any) -> None:
        if m.incarnation[rank] != gen[rank]:
            return
        if ok:
            m.initialized(rank)
        elif rt.peers.is_lost(placements[rank].name):  # an __init__ that raised reports FAILED
            why = f"actor {m.name}[{rank}] could not be spawned: {value}"
            new, _, _ = monitor._record(m.node, m.ref.mesh_id, rank, why)
            if new:
                failed(m, rank, why)

    collector = Collector(rt, f"{m.name}.__init__()", len(ranks), on_value)
    for r in ranks:
        collector.expect(r, placements[r])
    for r in ranks:
        header = Spawn(m.ref.mesh_id, r, collector.port, r, labels, sizes, owner, m.mode)
        rt.send(placements[r], header, body, bufs, on_fail=functools.partial(collector.fail, r))
