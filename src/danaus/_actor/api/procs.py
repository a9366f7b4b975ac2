"""``HostMesh`` and ``ProcMesh``: meshes of hosts and of OS processes, and spawning on them."""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import math
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ... import _config as config
from ..._errors import ActorError, RemoteException, SupervisionError
from ..._mesh import MeshTrait, Shape, Slice
from ..._runtime.hosting import host
from ..._runtime.hosting.command import describe as describe_command
from ..._runtime.logs.process import control as log_control
from ..._runtime.node import Node, bound, this_node
from ..._wire import codec
from ..._wire.ids import ProcId
from ..._wire.protocol import Spawn, StopProc
from ..core import owned, telemetry
from ..core.collect import Collector, Countdown, set_future, wait_ready
from ..core.context import ProcMeshOf, context
from ..core.future import Future
from . import stats as _stats
from .actor import actor_mode, validate_actor_class
from .extensions import Extensions, tensor_engine
from .mesh import ActorMesh, MeshRef, _State

__all__ = [
    "ProcMesh",
    "check_per_host",
    "children",
    "install",
    "owned_proc_meshes",
    "spawn_on",
    "spawned_meshes",
    "this_proc",
]

A = TypeVar("A")


class _Spawned:
    """Proc meshes this process spawned and has not stopped (a part of its node):
    ``shutdown_context()`` stops them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # guards meshes
        self.meshes: list[ProcMesh] = []


def owned_proc_meshes() -> list[ProcMesh]:
    """The proc meshes this process's node spawned and has not stopped (none: no node)."""
    return spawned_meshes(this_node(start=False))


def spawned_meshes(node: Node | None) -> list[ProcMesh]:
    """The proc meshes ``node`` spawned and has not stopped (none: no node)."""
    if node is None:
        return []
    spawned = node.part(_Spawned)
    with spawned.lock:
        return list(spawned.meshes)


@dataclass
class _ProcState:
    """Shared by a proc mesh and its slices in the process that spawned it."""

    owned: bool
    initialized: concurrent.futures.Future[Any] = field(default_factory=concurrent.futures.Future)
    stopped: bool = False
    node: Node | None = None  # the node (client session) that spawned these procs
    tensor_engine: Any = None  # the tensor engine's client side, made at first activate()
    log_label: str | None = None  # what log lines are prefixed with (the mesh's name)
    spawner: str | None = None  # the actor that spawned these procs ("proc/mesh[rank]")
    # Called with the mesh once ``stop()`` starts: whoever holds it (its HostMesh) lets go.
    on_stop: list[Callable[[ProcMesh], None]] = field(default_factory=list)


class ProcMesh(MeshTrait):
    """A mesh of procs (one OS process each). Spawn actors on it with `spawn()`."""

    def __init__(
        self,
        procs: tuple[ProcId, ...],
        shape: Shape,
        state: _ProcState,
        host_mesh: MeshTrait | None = None,  # the HostMesh (hosts.py imports this module)
    ) -> None:
        self._procs = procs
        self.__shape = shape
        self._state = state
        self._host_mesh = host_mesh

    @classmethod
    def _singleton(cls, proc: ProcId, node: Node | None = None) -> ProcMesh:
        """A one-proc mesh of ``proc``, reached from ``node`` (None: as an unpickled one)."""
        state = _ProcState(owned=False, node=node)
        state.initialized.set_result(True)
        return cls((proc,), Shape.unity(), state, None)

    @property
    def _shape(self) -> Shape:
        return self.__shape

    def _new_with_shape(self, shape: Shape) -> ProcMesh:
        return ProcMesh(self._procs, shape, self._state, self._host_mesh)

    def _selected(self) -> list[ProcId]:
        return [self._procs[r] for r in self._shape.ranks()]

    def _node(self) -> Node:
        """The node this proc mesh belongs to: the one it was spawned from, or, for a
        mesh unpickled in this process, this process's (looked up once, then kept)."""
        return bound(self._state)

    @property
    def initialized(self) -> Future[bool]:
        """Completes with ``True`` once every proc has booted; raises if one could not."""
        return Future._create(self._state.initialized, "the procs to boot")

    @property
    def host_mesh(self) -> Any:
        if self._host_mesh is None or len(self) != 1:
            raise NotImplementedError("host_mesh is only known for a one-proc mesh spawned here")
        return self._host_mesh

    def spawn(self, name: str, Class: type[A], *args: Any, **kwargs: Any) -> A:
        """Spawn an actor of ``Class`` on every proc; returns its ``ActorMesh`` at once.

        ``__init__(*args, **kwargs)`` runs in each proc before any message this
        caller sends to the new actors. Raises ``ValueError`` for a class that is
        not a valid actor, ``TypeError`` for unpicklable arguments,
        ``RuntimeError`` on procs that were stopped; a failing ``__init__``
        surfaces on ``mesh.initialized``.
        """
        return self._spawn(name, Class, args, kwargs, None)  # type: ignore[return-value]

    def _spawn(
        self, name: str, Class: Any, args: Any, kwargs: Any, mesh_id: str | None
    ) -> ActorMesh[Any]:
        if not isinstance(name, str) or not name:
            raise TypeError(f"spawn(name, Class, ...) needs a non-empty string name, got {name!r}")
        eps = validate_actor_class(Class)
        mode = actor_mode(Class, eps)
        if self._state.node is not None and self._state.node.closed:
            raise RuntimeError(
                f"{self!r} belongs to a client session that shutdown_context() ended; spawn "
                "new procs (this_host().spawn_procs(...)) and spawn actors on those"
            )
        if self._state.stopped:  # Monarch's words, and as Monarch's, at the spawn
            raise RuntimeError(
                "`ProcMesh` has already been stopped: spawn new procs "
                "(this_host().spawn_procs(...)) and spawn actors on those"
            )
        ctx = context()
        creator = ctx.actor_instance
        body, bufs = codec.dumps_checked(
            (Class, args, kwargs, name, creator), f"the class or arguments of actor {name!r}"
        )
        procs = self._selected()
        ext = self._shape.extent
        shape = Shape(list(ext.labels), Slice.new_row_major(list(ext.sizes)))
        mesh_id = mesh_id or f"{name}.{secrets.token_hex(3)}"
        if self._state.owned and self._state.log_label is None:
            # An unnamed proc mesh's output is labelled with its first actor mesh's name.
            self._state.log_label = name
            log_control(self._node()).set_options(list(self._procs), label=name)
        ref = MeshRef(mesh_id, name, Class, tuple(procs), creator.actor_id)
        # The mesh belongs to this proc mesh's node (its route sends with its runtime).
        node = self._node()
        state = _State(initialized=concurrent.futures.Future(), node=node)
        mesh: ActorMesh[Any] = ActorMesh(ref, shape, state, self)
        owned.register_actor_mesh(node, mesh)
        init_cf = state.initialized
        assert init_cf is not None
        if self._state.stopped:
            init_cf.set_exception(RuntimeError("`ProcMesh` has already been stopped"))
            return mesh
        rt = self._node().runtime
        countdown = Countdown(len(procs), lambda: set_future(init_cf, True, None))
        if not procs:
            return mesh

        def on_value(index: int, ok: bool, value: Any) -> None:
            if ok:
                countdown.tick()
            else:
                set_future(init_cf, False, value)

        collector = Collector(rt, f"{name}.__init__()", len(procs), on_value)
        labels, sizes = tuple(ext.labels), tuple(ext.sizes)
        for i, proc in enumerate(procs):
            collector.expect(i, proc)
        for i, proc in enumerate(procs):
            header = Spawn(mesh_id, i, collector.port, i, labels, sizes, ref.owner, mode)
            rt.send(proc, header, body, bufs, on_fail=functools.partial(collector.fail, i))
        return mesh

    def stop(self, reason: str = "stopped by client") -> Future[None]:
        """Stop every actor on these procs, then the processes (they finalise normally).

        Does not block; the future completes when every process has exited (its host
        agent saw it end, or was lost too; at most ``proc_exit_timeout`` after its
        connection closed).
        Raises ``ValueError`` on a slice or a mesh this process did not spawn.
        """
        if not self._state.owned or len(self) != len(self._procs):
            raise ValueError(
                "ProcMesh is not owned; must be stopped by an owner (the actor or client that "
                "spawned it), and as a whole, not a slice"
            )
        cf: concurrent.futures.Future[Any] = concurrent.futures.Future()
        if self._state.stopped:
            cf.set_result(None)
            return Future._create(cf, "the procs to stop")
        self._state.stopped = True
        engine, self._state.tensor_engine = self._state.tensor_engine, None
        if engine is not None:  # its sender thread, rendezvous store and owner actor
            engine.close()
        node = self._node()
        spawned = node.part(_Spawned)
        with spawned.lock:
            if self in spawned.meshes:
                spawned.meshes.remove(self)
        for forget in self._state.on_stop:
            forget(self)
        self._state.on_stop.clear()
        rt = node.runtime
        procs = list(self._procs)
        names = {p.name for p in procs}
        me = self

        def exited() -> None:  # nothing on these procs is anyone's any more
            owned.forget_on(node, names)
            owned.forget_proc_mesh(node, None, me)
            # then their last lines are printed (bounded wait)
            flushed = log_control(node).flush(procs, config.get("log_flush_timeout"))
            flushed.add_done_callback(lambda _: set_future(cf, True, None))

        countdown = Countdown(len(procs), exited)
        agents = log_control(node).agents
        bound = config.get("proc_exit_timeout")
        for proc in procs:
            rt.peers.mark_stopping(proc)
            rt.send(proc, StopProc(None, 0, reason), on_fail=lambda r: None)
            # Done when its host agent saw the process end, not when its connection
            # closed: its exit handlers (a telemetry exporter's last flush) run after.
            agent = agents.get(proc.name)
            rt.peers.when_exited(proc.name, countdown.tick, agent=agent and agent.name, bound=bound)
        return Future._create(cf, "the procs to stop")

    def _let_go(self) -> None:
        """Forget these procs here, all of them gone (lost or exited), without stopping
        anything: nothing is left to stop, and the actor meshes that ran on them are
        their owners' to restart or forget (a supervisor releases a replacement proc
        lost in turn this way). Afterwards the mesh is as if stopped."""
        if self._state.stopped:
            return
        self._state.stopped = True
        node = self._node()
        spawned = node.part(_Spawned)
        with spawned.lock:
            spawned.meshes[:] = [pm for pm in spawned.meshes if pm._state is not self._state]
        for forget in self._state.on_stop:
            forget(self)
        self._state.on_stop.clear()
        owned.forget_proc_mesh(node, None, self)

    def logging_option(
        self,
        stream_to_client: bool = True,
        aggregate_window_sec: float | None = 3,
        level: int = logging.INFO,
    ) -> Future[None]:
        """How these procs' output reaches this client (Monarch's options and defaults).

        ``stream_to_client``: forward stdout, stderr and logging records here
        (they always go to the per-proc log files). ``aggregate_window_sec``:
        collect lines for that many seconds, then print lines that differ only
        in numbers once, as ``[N similar lines] <example>``; ``None`` prints
        each line at once. ``level``: the level of the procs' root logger,
        so records below it are not forwarded (prints are). Applies to the
        procs of this mesh (or slice) before any message sent after it; the
        returned future is complete (``await`` it as in Monarch, or not).
        """
        if not isinstance(stream_to_client, bool):
            raise TypeError(f"stream_to_client must be True or False, got {stream_to_client!r}")
        if aggregate_window_sec is not None and (
            isinstance(aggregate_window_sec, bool)
            or not isinstance(aggregate_window_sec, (int, float))
            or aggregate_window_sec < 0
        ):
            raise ValueError(
                "aggregate_window_sec must be a number of seconds >= 0, or None to print each "
                f"line at once; got {aggregate_window_sec!r}"
            )
        if isinstance(level, bool) or not isinstance(level, int) or not 0 <= level <= 255:
            raise ValueError(
                f"Invalid logging level: {level!r}; use a level of the logging module, "
                "like logging.INFO (20) or logging.DEBUG (10)"
            )
        window = None if not aggregate_window_sec else float(aggregate_window_sec)
        ctl = log_control(self._node())
        procs = self._selected()
        ctl.set_options(procs, stream=stream_to_client, window=window, level=level)
        # A barrier behind the options at each host agent: output written after this
        # returns is captured under them (the agent reads it from a pipe, not a socket).
        ctl.flush(procs, config.get("log_flush_timeout")).result()
        return Future._resolved(None, "logging_option")

    def stats(self) -> Future[Any]:
        """The metrics of these procs: every actor's endpoints, every connection.

        Does not block; the future holds a ``MeshStats`` (``endpoints`` keyed
        ``"mesh.method"``: calls, errors, latency percentiles; ``procs``: bytes and
        frames per connection). A proc that is gone or does not answer within
        the ``stats_timeout`` setting is listed with the reason instead of
        holding the answer up. ``danaus.stats(actor_mesh)`` gives one actor mesh's.
        """
        return Future._create(
            _stats.mesh_stats(self._node().runtime, self._selected()), "the procs' statistics"
        )

    # -- the tensor engine: an optional extra above this layer, loaded on first use -------

    def activate(self) -> Any:
        """Make this mesh the one torch ops run on (``with procs.activate(): ...``). Needs torch.

        See ``danaus.Tensor``; does not block (spawns the tensor-engine workers
        on first use).
        """
        return tensor_engine(self._node()).activate(self)

    def deactivate(self) -> None:
        """End this mesh's latest ``activate()``. Does not block."""
        tensor_engine(self._node()).deactivate(self)

    def rank(self, dims: Any) -> Any:
        """A mesh tensor holding each proc's coordinate along ``dims`` (a name or a list)."""
        return tensor_engine(self._node()).mesh_rank(self, dims)

    @property
    def ranks(self) -> Any:
        """``{dim: self.rank(dim)}`` for every dimension of this mesh."""
        return tensor_engine(self._node()).mesh_ranks(self)

    def rank_tensor(self, dim: Any) -> Any:
        """Monarch's name for `rank()`."""
        return self.rank(dim)

    def rank_tensors(self) -> Any:
        """Monarch's name for `ranks`."""
        return self.ranks

    def process_group(self, dims: Any) -> Any:
        """A ``danaus.RemoteProcessGroup`` over ``dims`` (a name or several). Needs torch.

        Passed to a ``danaus.remote`` function, it is a ``torch.distributed``
        process group there, of the procs sharing every coordinate outside
        ``dims``. Raises ``ValueError`` for a dimension this mesh lacks or one
        named twice.
        """
        return tensor_engine(self._node()).process_group(self, dims)

    async def __aenter__(self) -> ProcMesh:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()

    def __reduce__(self) -> Any:
        rt = self._node().runtime
        wait_ready(rt, self._procs)
        return (_rebuild_proc_mesh, (tuple(rt.peers.resolve(p) for p in self._procs), self._shape))

    def __repr__(self) -> str:
        return f"<ProcMesh {self.sizes}>"


def _rebuild_proc_mesh(procs: tuple[ProcId, ...], shape: Shape) -> ProcMesh:
    state = _ProcState(owned=False)
    state.initialized.set_result(True)
    return ProcMesh(procs, shape, state, None)


def spawn_on(
    node: Node,
    agents: list[ProcId | None],
    per_host: dict[str, int],
    host_shape: Shape,
    bootstrap: Callable[[], Any] | None,
    name: str | None,
    host_mesh: MeshTrait | None,  # the HostMesh spawning them
    binds: list[dict[str, str]] | None = None,
    commands: list[dict[str, Any]] | None = None,
) -> ProcMesh:
    """Spawn ``per_host`` procs on each host (``agents[i]`` for the i-th host of the mesh),
    from ``node`` (they belong to it).

    Returns the ``ProcMesh`` at once; its dimensions are the hosts' then ``per_host``'s.
    ``binds``: the CPU/NUMA binding of each proc of a host, in order (``proc_bind``).
    ``commands``: the bootstrap command of each proc, in mesh order (``bootcmd``);
    ``None``: each is forked from its host's zygote.
    The caller spawns the registry actor first (``controller.ensure_registry``), so
    that the procs can reach it before any of them starts.
    """
    rt = node.runtime
    serve_dashboard = node.part(Extensions).serve_dashboard
    if config.get("dashboard") and not rt.boot and serve_dashboard is not None:
        serve_dashboard()  # DANAUS_DASHBOARD=1: on first spawn
    if bootstrap is not None and not callable(bootstrap):
        raise TypeError(f"bootstrap must be a callable taking no arguments, got {bootstrap!r}")
    labels = [*host_shape.labels, *per_host]
    sizes = [*host_shape.extent.sizes, *per_host.values()]
    local = math.prod(per_host.values())
    boot_fn = codec.dumps_checked(bootstrap, "the bootstrap function")[0] if bootstrap else None
    telemetry.sync_with_config()  # the setting `telemetry`: on before the procs boot
    tel_env = telemetry.env_for_procs()  # they turn it on as this process did
    procs: list[ProcId] = []
    logs = log_control(node)
    for agent in agents:
        batch = []
        for i in range(local):
            nm = host.new_proc_name()
            proc = ProcId(nm, f"unix:{rt.job_dir}/{nm}.sock")
            coords = ",".join(
                f"{label}={c}"
                for label, c in zip(labels, _coords_of(len(procs), sizes), strict=True)
            )
            boot = host.boot_for(node, rt.proc_id, bootstrap=boot_fn, name=name or "anon")
            boot = {**boot, "coords": coords}
            if tel_env:
                boot["env"] = {**boot.get("env", {}), **tel_env}
            if binds is not None and binds[i]:
                boot["bind"] = binds[i]
            if commands is not None:
                boot["command"] = commands[len(procs)]
            batch.append((proc, boot))
            procs.append(proc)
        host.spawn_procs(node, batch, agent)
        logs.track((p for p, _ in batch), agent or host.agent(node))
    spawner = context().actor_instance.actor_id
    state = _ProcState(owned=True, node=node, log_label=name, spawner=str(spawner))
    if rt.boot and "children" not in rt.observing.observers:
        # A proc that spawns procs tells whoever asks for its statistics about them,
        # so the client's dashboard and traces find procs it did not spawn itself.
        rt.observing.observers["children"] = functools.partial(children, node)
    pm = ProcMesh(tuple(procs), Shape(labels, Slice.new_row_major(sizes)), state, host_mesh)
    _track_boot(node, tuple(procs), state.initialized, commands)
    if rt.tracer is not None:  # a trace is running: these procs join it from the start
        sent = time.perf_counter_ns()
        arrived = [0] * len(procs)
        answers = _stats.ask_trace_start(rt, procs, arrived)
        rt.tracer.late.append((tuple(procs), sent, arrived, answers))
    spawned = node.part(_Spawned)
    with spawned.lock:
        spawned.meshes.append(pm)
    owned.register_proc_mesh(node, spawner, pm)
    return pm


def install(node: Node, boot: dict[str, Any]) -> None:
    """``context().actor_instance.proc`` on ``node`` is a one-proc ``ProcMesh``."""
    node.part(ProcMeshOf).make = functools.partial(ProcMesh._singleton, node=node)


def children(node: Node) -> list[dict[str, Any]]:
    """The proc meshes ``node`` spawned and has not stopped, as plain data.

    One entry per mesh: its index here, name, dimensions, the actor that
    spawned it, and each proc's name, freshest address and (if this process
    has lost it) why. Runs on the I/O thread, in a ``STATS`` answer.
    """
    rt = node.runtime
    out = []
    for index, pm in enumerate(spawned_meshes(node)):
        ext = pm._shape.extent
        out.append(
            {
                "index": index,
                "name": pm._state.log_label,
                "labels": list(ext.labels),
                "sizes": list(ext.sizes),
                "spawner": pm._state.spawner,
                "procs": [
                    {
                        "proc": p.name,
                        "addr": rt.peers.resolve(p).addr,
                        "lost": rt.peers.is_lost(p.name),
                    }
                    for p in pm._procs
                ],
            }
        )
    return out


def _coords_of(rank: int, sizes: list[int]) -> list[int]:
    """Row-major coordinates of ``rank`` in a mesh of ``sizes``."""
    out = []
    for size in reversed(sizes):
        rank, c = divmod(rank, size)
        out.append(c)
    return out[::-1]


def check_per_host(per_host: Any, host_labels: list[str]) -> dict[str, int]:
    if per_host is None:
        return {}
    if not isinstance(per_host, dict):
        raise TypeError(f"per_host must be a dict like {{'gpus': 4}}, got {per_host!r}")
    for k, v in per_host.items():
        if not isinstance(k, str) or not k:
            raise TypeError(f"per_host keys must be dimension names (str), got {k!r}")
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"per_host[{k!r}] must be an int >= 1, got {v!r}")
        if k in host_labels:
            raise ValueError(
                f"per_host dimension {k!r} is already a dimension of the host mesh "
                f"{host_labels}; choose another name"
            )
    return dict(per_host)


def _track_boot(
    node: Node,
    procs: tuple[ProcId, ...],
    cf: concurrent.futures.Future[Any],
    commands: list[dict[str, Any]] | None = None,
) -> None:
    rt = node.runtime
    countdown = Countdown(len(procs), lambda: set_future(cf, True, True))

    def one(index: int, proc: ProcId, error: str | None) -> None:
        if error is not None:
            if "bootstrap" in error:
                err: Exception = ActorError(RemoteException("BootstrapError", error), error, error)
            else:
                message = f"proc {proc.name} failed to start: {error}"
                if commands is not None:
                    message += _command_failure(node, proc, commands[index])
                err = SupervisionError(message, reason=error, during="spawn")
            set_future(cf, False, err)
            return
        countdown.tick()

    for i, p in enumerate(procs):
        rt.peers.when_ready(p, functools.partial(one, i, p))


def _command_failure(node: Node, proc: ProcId, command: dict[str, Any]) -> str:
    """What to add to a proc's start failure when a bootstrap command started it: the
    command, and the last lines of its output (the agent sent them before the loss)."""
    lines = log_control(node).last_lines(proc.name)
    shown = "".join(f"\n    {line}" for line in lines) if lines else " (none)"
    return (
        f"; it was started by the bootstrap command {describe_command(command)!r}, "
        f"whose last lines of output were:{shown}"
    )


def this_proc() -> ProcMesh:
    """The proc this code runs in: the client's own process, or the current actor's proc.

    Actors spawned on it run inside this process.
    """
    proc: ProcMesh = context().actor_instance.proc  # typed Any in the core (context.py)
    return proc
