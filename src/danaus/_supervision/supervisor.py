"""``Supervisor``: OTP's restart strategies over actor meshes (``danaus.supervisor``).

A supervisor spawns its children (actor meshes) and restarts the ranks that
fail, instead of telling their owner::

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
import math
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from .. import _config as config
from .._actor.api.actor import actor_mode, validate_actor_class
from .._actor.api.adverbs import Endpoint
from .._actor.api.mesh import ActorMesh, MeshRef, _State
from .._actor.api.procs import ProcMesh, spawn_on
from .._actor.api.route import DirectRoute, Route
from .._actor.core import owned
from .._actor.core.collect import Collector, Countdown, set_future
from .._actor.core.context import Context, acting_as, context
from .._actor.core.future import Future
from .._errors import SupervisionError
from .._mesh import Shape, Slice
from .._runtime.hosting import host
from .._runtime.logs.dirs import NOTIFY
from .._runtime.logs.process import LogControl
from .._wire import codec
from .._wire.ids import ProcId
from .._wire.protocol import Spawn, StopActor
from . import monitor
from .failure import MeshFailure
from .supervised import supervised

__all__ = ["Backoff", "Restart", "Supervisor"]

log = logging.getLogger("danaus.supervision")

A = TypeVar("A")

STRATEGIES = ("one_for_one", "one_for_all", "rest_for_one")


@dataclass(frozen=True)
class Backoff:
    """Wait before each restart: ``initial`` seconds, doubled for each restart already
    made within the supervisor's period, at most ``cap``."""

    initial: float
    cap: float

    def __post_init__(self) -> None:
        for what, v in (("initial", self.initial), ("cap", self.cap)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise TypeError(f"Backoff {what} must be a number of seconds, got {v!r}")
            if v < 0:
                raise ValueError(f"Backoff {what} must be >= 0 seconds, got {v!r}")
        if self.cap < self.initial:
            raise ValueError(
                f"Backoff cap ({self.cap!r} s) must be at least its initial delay "
                f"({self.initial!r} s)"
            )

    def delay(self, earlier: int) -> float:
        """The wait before a restart that follows ``earlier`` restarts within the period."""
        return float(min(self.cap, self.initial * 2 ** min(earlier, 64)))


@dataclass(frozen=True)
class Restart:
    """One restart a supervisor made: when (``time.time()``), which child (a mesh's or a
    nested supervisor's name), which of its ranks, why; ``delay`` is the backoff it
    waited and ``failed_at`` when it saw the failure (``time.time()``)."""

    time: float
    child: str
    ranks: tuple[int, ...]
    reason: str
    delay: float = 0.0
    failed_at: float = 0.0
    supervisor: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "time": self.time,
            "child": self.child,
            "ranks": list(self.ranks),
            "reason": self.reason,
            "delay": self.delay,
            "failed_at": self.failed_at,
            "supervisor": self.supervisor,
        }


# -- the children -----------------------------------------------------------------------


class _Thunk:
    """A call held while ranks it targets restart: sent, in order, once they are up."""

    __slots__ = ("ranks", "run")

    def __init__(self, ranks: frozenset[int], run: Callable[[], None]) -> None:
        self.ranks = ranks
        self.run = run


class _MeshChild:
    """An actor mesh a supervisor spawned: how to spawn each rank again, and its calls."""

    def __init__(self, sup: Supervisor, ref: MeshRef, state: _State, shape: Shape) -> None:
        self.sup = sup
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
        self.handle: SupervisedMesh[Any] | None = None

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


# -- the handle --------------------------------------------------------------------------


class SupervisedMesh(ActorMesh[A]):
    """The ``ActorMesh`` of a supervised child: valid across restarts.

    It reads the child's current procs, holds calls to ranks being restarted
    until their new actors are spawned, and is always messaged directly (not
    through a cast tree, whose routes are fixed per mesh).
    """

    def __init__(self, child: _MeshChild, shape: Shape) -> None:
        self._child = child
        super().__init__(child.ref, shape, child.state, None)

    @property
    def _ref(self) -> MeshRef:
        return self._child.ref

    @_ref.setter
    def _ref(self, value: MeshRef) -> None:
        pass  # the child's ref is the one

    def _new_with_shape(self, shape: Shape) -> SupervisedMesh[A]:
        return SupervisedMesh(self._child, shape)

    @property
    def _route(self) -> Route:
        """Always direct, its targets read anew each time (a restart may move a rank)."""
        route: Route | None = self.__dict__.get("_route_")
        if route is None:
            route = self.__dict__["_route_"] = _SupervisedRoute(self._child, self._shape, self)
        return route

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_child", "_state", "_endpoints", "_proc_mesh"):
            raise AttributeError(name)
        prop = self._endpoints.get(name)
        if prop is not None:
            ep = _SupervisedEndpoint(self._route, name, prop)
            ep._child = self._child
            ep._ranks = frozenset(self._shape.ranks())
            object.__setattr__(self, name, ep)
            return ep
        return super().__getattr__(name)

    @property
    def initialized(self) -> Future[None]:
        """Completes when every rank has an actor whose ``__init__`` ran (after restarts,
        if a first one failed); raises ``SupervisionError`` if the supervisor gave up."""
        return Future._create(self._child.sup._ready_future(self._child), f"{self.name} ready")

    def stop(self, reason: str = "stopped by client") -> Future[None]:
        """Stop these actors; the supervisor restarts them no more (a whole mesh)."""
        child = self._child
        ranks = self._shape.ranks()
        whole = len(ranks) == child.size
        cf: concurrent.futures.Future[Any] = concurrent.futures.Future()
        if child.state.stopped or not ranks:
            cf.set_result(None)
            return Future._create(cf, f"stopping {self.name!r}")
        if whole:
            child.sup._retire(child)
        done = _stop_ranks(child.ref, ranks, reason)

        def finished(_: Any) -> None:
            if whole:
                owned.forget(child.ref.mesh_id)
            set_future(cf, True, None)

        done.add_done_callback(finished)
        return Future._create(cf, f"stopping actor mesh {self.name!r}")

    def __repr__(self) -> str:
        return f"<ActorMesh {self.name!r} of {self._ref.cls.__qualname__} {self.sizes} supervised>"


class _SupervisedRoute(DirectRoute):
    """A supervised mesh's route: direct (a cast tree's routes are fixed per mesh), to
    the child's current procs (a restart may move a rank)."""

    def __init__(self, child: _MeshChild, shape: Shape, mesh: SupervisedMesh[Any]) -> None:
        self._child = child
        rt = host.ensure_runtime()
        super().__init__(rt, child.ref, shape, child.state, fixed=False, mesh=mesh)

    @property
    def ref(self) -> MeshRef:
        return self._child.ref

    @ref.setter
    def ref(self, value: MeshRef) -> None:
        pass  # the child's ref is the one


class _SupervisedEndpoint(Endpoint[Any, Any]):
    """An endpoint of a supervised mesh: holds its call while a rank it targets restarts."""

    _child: _MeshChild
    _ranks: frozenset[int]  # the ranks of the whole mesh it targets

    def _deferred(
        self, method: Callable[..., Any], args: Any, kwargs: Any, n: int, check: Any = None
    ) -> Any:
        """None: send now. Else hold ``method(*args, **kwargs)`` until the ranks it targets
        are restarted; ``n`` futures stand in for the ones it returns."""
        child = self._child
        if not child.held:  # the common case: one attribute read
            return None
        self._prop.bind(*(check or (args, kwargs)))  # a wrong call raises here, not later
        cfs: list[concurrent.futures.Future[Any]] = [concurrent.futures.Future() for _ in range(n)]

        def run() -> None:
            try:
                got = method(*args, **kwargs)
            except BaseException as e:
                for cf in cfs:
                    set_future(cf, False, e)
                if not cfs:
                    log.warning("a held %s could not be sent: %r", self._what, e)
                return
            futs = [got] if n == 1 else (list(got) if n else [])
            for inner, cf in zip(futs, cfs, strict=True):
                inner._cf.add_done_callback(functools.partial(_copy, cf))

        ctx = context()

        def later() -> None:
            with acting_as(ctx):
                run()

        if not child.hold(self._ranks, later):
            return None
        return [Future._create(cf, self._what) for cf in cfs]

    def call(self, *args: Any, **kwargs: Any) -> Future[Any]:
        held = self._deferred(super().call, args, kwargs, 1)
        return held[0] if held is not None else super().call(*args, **kwargs)

    def call_one(self, *args: Any, **kwargs: Any) -> Future[Any]:
        held = self._deferred(super().call_one, args, kwargs, 1)
        return held[0] if held is not None else super().call_one(*args, **kwargs)

    def choose(self, *args: Any, **kwargs: Any) -> Future[Any]:
        held = self._deferred(super().choose, args, kwargs, 1)
        return held[0] if held is not None else super().choose(*args, **kwargs)

    def stream(self, *args: Any, **kwargs: Any) -> Any:
        n = len(self._ranks)
        held = self._deferred(super().stream, args, kwargs, n)
        return iter(held) if held is not None else super().stream(*args, **kwargs)

    def broadcast(self, *args: Any, **kwargs: Any) -> None:
        if self._deferred(super().broadcast, args, kwargs, 0) is None:
            super().broadcast(*args, **kwargs)

    def _send_to_port(self, args: Any, kwargs: Any, port: Any, selection: str) -> None:
        method = super()._send_to_port
        send = lambda: method(args, kwargs, port, selection)  # noqa: E731
        if self._deferred(send, (), {}, 0, (args, kwargs)) is None:
            method(args, kwargs, port, selection)


def _copy(cf: concurrent.futures.Future[Any], inner: Any) -> None:
    exc = inner.exception()
    set_future(cf, exc is None, inner.result() if exc is None else exc)


def _stop_ranks(ref: MeshRef, ranks: list[int], reason: str) -> concurrent.futures.Future[Any]:
    """Stop actors ``ranks`` of ``ref`` directly (a dead proc counts as stopped)."""
    rt = host.ensure_runtime()
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


# -- the supervisor -----------------------------------------------------------------------


class _Tree:
    """What a tree of supervisors shares: one queue of failures and one thread."""

    def __init__(self, name: str) -> None:
        self.lock = threading.Lock()  # guards events and thread
        self.wake = threading.Condition(self.lock)
        self.events: collections.deque[tuple[Any, ...]] = collections.deque()
        self.thread: threading.Thread | None = None
        self.ended = threading.Event()
        self.name = name


class Supervisor:
    """Restarts the actors it spawns when they fail, as Erlang/OTP's supervisors do.

    ``strategy``: ``"one_for_one"`` restarts only the failed ranks;
    ``"one_for_all"`` every rank of every child; ``"rest_for_one"`` the failed
    child (all its ranks) and every child spawned after it. More than
    ``max_restarts`` restarts within ``period`` seconds and the supervisor
    stops its children and gives up: its owner (the actor that made it, or the
    client) gets a ``MeshFailure`` saying so. ``backoff``: a :class:`Backoff`
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
        if strategy not in STRATEGIES:
            raise ValueError(
                f"strategy must be one of {', '.join(map(repr, STRATEGIES))}, got {strategy!r}"
            )
        if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
            raise ValueError(f"max_restarts must be an int >= 0, got {max_restarts!r}")
        if (
            isinstance(period, bool)
            or not isinstance(period, (int, float))
            or not math.isfinite(period)
            or period <= 0
        ):
            raise ValueError(f"period must be a number of seconds > 0, got {period!r}")
        if isinstance(backoff, tuple):
            if len(backoff) != 2:
                raise ValueError(f"backoff must be (initial, cap) in seconds, got {backoff!r}")
            backoff = Backoff(*backoff)
        if backoff is not None and not isinstance(backoff, Backoff):
            raise TypeError(f"backoff must be a Backoff, (initial, cap) or None, got {backoff!r}")
        if spare_hosts is not None and not hasattr(spare_hosts, "spawn_procs"):
            raise TypeError(f"spare_hosts must be a HostMesh, got {spare_hosts!r}")
        if not isinstance(name, str) or not name:
            raise TypeError(f"name must be a non-empty string, got {name!r}")
        self.strategy = strategy
        self.max_restarts = max_restarts
        self.period = float(period)
        self.backoff: Backoff | None = backoff
        self.spare_hosts = spare_hosts
        self.name = name
        ctx = context()
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
        self._ready: dict[int, tuple[concurrent.futures.Future[Any], set[int]]] = {}
        self._spare_next = 0
        self._procs: list[ProcMesh] = []  # the procs restarts spawned (stopped with us)
        self._stop_event = threading.Event()
        reg = supervised()
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
        child = _MeshChild(self, ref, _State(initialized=concurrent.futures.Future()), shape)
        child.body, child.mode = body, mode
        handle: SupervisedMesh[Any] = SupervisedMesh(child, shape)
        child.handle = handle
        with self._lock:
            self._children.append(child)
        supervised().watch(mesh_id, functools.partial(self._on_failure, child))
        owned.register_actor_mesh(handle)
        self._spawn_ranks(child, {r: p for r, p in enumerate(ref.procs)})
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
            self._end_thread()
        return Future._resolved(None, f"stopping supervisor {self.name!r}")

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
            self._start_thread()
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

    # -- the thread -------------------------------------------------------------------------

    def _start_thread(self) -> None:
        tree = self._tree  # lock held
        if tree.thread is None and not tree.ended.is_set():
            tree.thread = threading.Thread(
                target=self._run, name=f"danaus-supervisor-{tree.name}", daemon=True
            )
            tree.thread.start()

    def _run(self) -> None:
        tree = self._tree
        while True:
            with tree.lock:
                while not tree.events and not tree.ended.is_set():
                    tree.wake.wait()
                ended = tree.ended.is_set()
                if ended:
                    events = list(tree.events)
                    tree.events.clear()
                else:
                    ev = tree.events.popleft()
            if ended:
                # Outside the lock: releasing sends the held calls, and a send may wait
                # for the I/O thread, which takes the tree's lock to report failures.
                for left in events:
                    left[0]._release_all()
                return
            sup = ev[0]
            try:
                sup._handle(*ev[1:])
            except Exception as e:  # a restart that cannot be made: the owner must hear
                log.exception("supervisor %r failed to handle a failure", sup.name)
                try:
                    sup._give_up(
                        [str(ev[3])],
                        why=f"supervisor {sup.name!r} gave up: handling the failure "
                        f"({ev[3]}) raised {type(e).__name__}: {e}",
                    )
                except Exception:
                    log.exception("supervisor %r could not give up cleanly", sup.name)
            with tree.lock:
                idle = not tree.events
            if idle:  # nothing more is coming: no rank should wait any longer
                sup._root()._release_all()

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
        self, child: Any, incarnations: dict[int, int], reason: str, failed_at: float
    ) -> None:
        if self._status != "running" or self._stale(child, incarnations):
            return
        ranks = {r for r, n in incarnations.items() if r >= 0}
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
        # Failures that arrived meanwhile and that this restart covers are not restarted again.
        targets = self._affected(child, ranks)
        for c in self._picked(child):
            if isinstance(c, Supervisor) and c._status != "stopped":
                c._revive()  # a restarted supervisor starts afresh
        self._restart(targets, reason)
        rec = Restart(
            time.time(), child.name, tuple(sorted(ranks)) if ranks else (), reason,
            delay, failed_at, self.name,
        )  # fmt: skip
        self._announce(rec, targets)  # before it is listed: whoever sees it can find the log
        with self._lock:
            self._history.append(time.monotonic())
            self._restarts.append(rec)

    def _announce(self, rec: Restart, targets: dict[_MeshChild, set[int]]) -> None:
        moved = ", ".join(f"{m.name}{sorted(r)}" for m, r in targets.items())
        log.warning(  # to the terminal too: a restart is news the user must hear of
            "supervisor %r restarted %s (%s) after: %s",
            self.name, rec.child, moved, rec.reason,
            extra={NOTIFY: True},
        )  # fmt: skip
        rt = host.ensure_runtime()
        tracer = rt.tracer
        if tracer is not None:
            t0 = tracer.now() - int((rec.time - rec.failed_at) * 1e9)
            tracer.span(
                f"restart {rec.child}",
                "supervision",
                t0,
                {"supervisor": self.name, "ranks": list(rec.ranks), "reason": rec.reason,
                 "delay_s": rec.delay, "restarted": moved},
            )  # fmt: skip

    # -- restarting ------------------------------------------------------------------------

    def _restart(self, targets: dict[_MeshChild, set[int]], reason: str) -> None:
        """Stop the healthy ones of ``targets``, spawn each rank again, release its calls."""
        timeout = config.get("shutdown_timeout")
        stopping = []
        for m, ranks in targets.items():
            healthy = [r for r in sorted(ranks) if r not in m.state.failed]
            stopping.append(_stop_ranks(m.ref, healthy, f"restarted by supervisor {self.name!r}"))
        for f in stopping:
            try:
                f.result(timeout)
            except Exception as e:
                log.warning("supervisor %r: a stop before a restart failed: %r", self.name, e)
        for m, ranks in targets.items():
            if m.stopped:
                continue
            placements = self._place(m, ranks)
            with m.state.lock:
                for r in placements:
                    m.incarnation[r] += 1
                    m.state.failed.pop(r, None)
                    m.state.tracebacks.pop(r, None)
            m.state.stopped = False
            self._spawn_ranks(m, placements)
            m.release(set(ranks))

    def _place(self, m: _MeshChild, ranks: set[int]) -> dict[int, ProcId]:
        """Where each rank goes: its proc if alive, else a new proc on its host, else a
        spare host's. Updates the child's procs."""
        rt = host.ensure_runtime()
        node = host.ensure_node()
        logs = node.part(LogControl)
        procs = list(m.ref.procs)
        by_agent: dict[ProcId | None, list[int]] = {}
        for r in sorted(ranks):
            p = procs[r]
            if not rt.is_lost(p.name) and p.name not in rt.exited:
                continue
            agent = logs.agents.get(p.name)
            lost_agent = agent is not None and (rt.is_lost(agent.name) or (agent.name in rt.exited))
            by_agent.setdefault(None if lost_agent else (agent or host.agent()), []).append(r)
        for agent, rs in by_agent.items():
            new = self._new_procs(agent, len(rs), m.name) if agent is not None else None
            if new is None:
                new = self._spare_procs(len(rs), m.name)
            if new is None:
                log.error(
                    "supervisor %r: no host to restart %s%s on; they stay failed",
                    self.name, m.name, rs,
                )  # fmt: skip
                continue
            for r, p in zip(rs, new, strict=True):
                procs[r] = p
        if tuple(procs) != m.ref.procs:
            m.ref = replace(m.ref, procs=tuple(procs))
            om = owned.get(m.ref.mesh_id)
            if om is not None:
                om.ref = m.ref
        return {r: procs[r] for r in ranks}

    def _new_procs(self, agent: ProcId | None, n: int, name: str) -> list[ProcId] | None:
        try:
            with acting_as(self._ctx):
                pm = spawn_on([agent], {"procs": n}, Shape.unity(), None, name, None)
            self._procs.append(pm)
            pm.initialized.get(timeout=config.get("worker_start_timeout"))
        except Exception as e:
            log.warning("supervisor %r: no new proc on host agent %s: %r", self.name, agent, e)
            return None
        return list(pm._procs)

    def _spare_procs(self, n: int, name: str) -> list[ProcId] | None:
        spares = self.spare_hosts
        if spares is None:
            return None
        flat = spares.flatten("spare_hosts")
        size = len(flat)
        for _ in range(size):
            i = self._spare_next % size
            self._spare_next += 1
            try:
                with acting_as(self._ctx):
                    pm = flat.slice(spare_hosts=i).spawn_procs(per_host={"procs": n}, name=name)
                self._procs.append(pm)
                pm.initialized.get(timeout=config.get("worker_start_timeout"))
            except Exception as e:
                log.warning("supervisor %r: spare host %d refused procs: %r", self.name, i, e)
                continue
            return list(pm._procs)
        return None

    def _spawn_ranks(self, m: _MeshChild, placements: dict[int, ProcId]) -> None:
        """Send SPAWN for each rank to its proc; calls sent after this queue behind it."""
        if not placements:
            return
        rt = host.ensure_runtime()
        labels = tuple(m.shape.extent.labels)
        sizes = tuple(m.shape.extent.sizes)
        body, bufs = m.body
        ranks = sorted(placements)
        gen = {r: m.incarnation[r] for r in ranks}

        def on_value(rank: int, ok: bool, value: Any) -> None:
            if m.incarnation[rank] != gen[rank]:
                return
            if ok:
                self._initialized(m, rank)
            elif rt.is_lost(placements[rank].name):  # an __init__ that raised reports FAILED
                why = f"actor {m.name}[{rank}] could not be spawned: {value}"
                new, _, _ = monitor._record(m.ref.mesh_id, rank, why)
                if new:
                    self._on_failure(m, rank, why, "", ())

        collector = Collector(rt, f"{m.name}.__init__()", len(ranks), on_value)
        for r in ranks:
            collector.expect(r, placements[r])
        for r in ranks:
            header = Spawn(m.ref.mesh_id, r, collector.port, r, labels, sizes, self._owner, m.mode)
            rt.send(placements[r], header, body, bufs, on_fail=functools.partial(collector.fail, r))

    def _initialized(self, m: _MeshChild, rank: int) -> None:
        with self._lock:
            entry = self._ready.get(id(m))
            if entry is None:
                entry = self._ready[id(m)] = (concurrent.futures.Future(), set())
            entry[1].add(rank)
            done = len(entry[1]) == m.size
        if done:
            set_future(entry[0], True, None)
            if m.state.initialized is not None:
                set_future(m.state.initialized, True, None)

    def _ready_future(self, m: _MeshChild) -> concurrent.futures.Future[Any]:
        with self._lock:
            entry = self._ready.get(id(m))
            if entry is None:
                entry = self._ready[id(m)] = (concurrent.futures.Future(), set())
            return entry[0]

    # -- stopping and giving up --------------------------------------------------------------

    def _retire(self, child: _MeshChild) -> None:
        """A child was stopped by its user: never restart it, fail what waits for it."""
        child.stopped = True
        child.state.stopped = True
        supervised().forget(child.ref.mesh_id)
        child.release()  # held calls now hear that the mesh was stopped
        err = SupervisionError(
            f"actor mesh {child.name!r} was stopped", actor=child.name, reason="stopped"
        )
        set_future(self._ready_future(child), False, err)

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
            _stop_ranks(m.ref, list(range(m.size)), reason) for m in meshes if not m.stopped
        ]
        for f in stopping:
            try:
                f.result(config.get("shutdown_timeout"))
            except Exception as e:
                log.warning("supervisor %r: a child did not stop cleanly: %r", self.name, e)
        for m in meshes:
            if final:
                self._retire(m)
                owned.forget(m.ref.mesh_id)
        if final:
            for sub in self._children_supervisors():
                sub._status = status
            procs, self._procs = self._procs, []
            for pm in procs:
                try:
                    pm.stop(reason).get(timeout=config.get("shutdown_timeout"))
                except Exception as e:
                    log.warning("supervisor %r: procs did not stop cleanly: %r", self.name, e)

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
            monitor.deliver(host.ensure_runtime(), self._owner, failure)
        self._end_thread()

    def _end_thread(self) -> None:
        tree = self._tree
        with tree.lock:
            tree.ended.set()
            tree.wake.notify_all()

    def _end_quietly(self) -> None:
        self._status = "stopped"
        self._end_thread()
