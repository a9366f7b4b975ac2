"""``HostMesh``: a mesh of hosts — this one (``this_host()``) or workers joined over TCP.

A host is reached through its host agent. ``this_host()`` is the local host
(its agent starts with the first spawn); ``attach_to_workers`` joins hosts
that run ``danaus worker --listen tcp://...``. Joining authenticates with the
job secret and makes this client listen on TCP too, so the procs on those
hosts can answer it.
"""

from __future__ import annotations

import concurrent.futures
import functools
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ... import _config as config
from ..._mesh import MeshTrait, Point, Shape
from ..._runtime.hosting import binding
from ..._runtime.node import Node, bound, this_node
from ..._wire.ids import ProcId
from ..._wire.protocol import ShutdownHost
from ..core.collect import Countdown, set_future
from ..core.future import Future
from .bootcmd import BootstrapCommand, commands_for, default_bootstrap_cmd
from .code_sync import (
    CodeSyncActor,
    SyncReport,
    Workspace,
    _Syncs,
    check_dirs,
    run_in_thread,
    sync,
    workspace_bootstrap,
)
from .controller import ensure_registry
from .procs import ProcMesh, check_per_host, spawn_on

__all__ = ["HostMesh", "this_host"]


@dataclass
class _HostState:
    agents: concurrent.futures.Future[Any]  # tuple of agent ProcIds (None: this host's)
    owned: bool
    shut_down: bool = False
    name: str | None = None  # attach_to_workers(name=...): how the mesh shows itself
    # The proc meshes spawned through this mesh and not stopped (``stop()`` stops them);
    # a mesh leaves once it is stopped, so a long run of spawns and stops holds none.
    proc_meshes: list[ProcMesh] = field(default_factory=list)
    syncs: _Syncs = field(default_factory=_Syncs)  # sync_workspace's procs and directories
    lock: threading.Lock = field(default_factory=threading.Lock)  # guards proc_meshes
    # The node the hosts are reached from: the one that attached them (or whose host it
    # is); None for a mesh unpickled here until first used (then this process's).
    node: Node | None = None

    def add(self, pm: ProcMesh) -> None:
        with self.lock:
            self.proc_meshes.append(pm)
        pm._state.on_stop.append(self.forget)

    def forget(self, pm: ProcMesh) -> None:
        """``pm`` was stopped: this mesh no longer holds it (nor its slices)."""
        with self.lock:
            self.proc_meshes[:] = [p for p in self.proc_meshes if p._state is not pm._state]

    def take(self) -> list[ProcMesh]:
        """The meshes to stop (``stop()``, ``shutdown()``); none is held after."""
        with self.lock:
            meshes, self.proc_meshes = self.proc_meshes, []
        return meshes


class HostMesh(MeshTrait):
    """A mesh of hosts; ``spawn_procs`` starts processes on each of them."""

    def __init__(
        self, shape: Shape, state: _HostState, command: BootstrapCommand | None = None
    ) -> None:
        self.__shape = shape
        self._state = state
        self._command = command  # with_python_executable's: spawn_procs' default command

    @property
    def _shape(self) -> Shape:
        return self.__shape

    def _new_with_shape(self, shape: Shape) -> HostMesh:
        return HostMesh(shape, self._state, self._command)

    @property
    def initialized(self) -> Future[bool]:
        """Completes with ``True`` once every host is attached; raises if one is unreachable."""
        cf: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._state.agents.add_done_callback(
            lambda f: set_future(cf, f.exception() is None, f.exception() or True)
        )
        return Future._create(cf, "the hosts to attach")

    def _node(self) -> Node:
        """The node this mesh belongs to (see ``_HostState.node``)."""
        return bound(self._state)

    def _agents(self) -> list[ProcId | None]:
        try:
            agents = self._state.agents.result(
                config.get("attach_retry_deadline") + config.get("attach_timeout")
            )
        except concurrent.futures.TimeoutError:
            raise TimeoutError(
                f"attaching to the workers took longer than {config.get('attach_timeout')} s"
            ) from None
        return [agents[r] for r in self._shape.ranks()]

    def spawn_procs(
        self,
        per_host: dict[str, int] | None = None,
        bootstrap: Callable[[], Any] | None = None,
        name: str | None = None,
        proc_bind: list[dict[str, str]] | None = None,
        bootstrap_command: BootstrapCommand | Callable[[Point], BootstrapCommand] | None = None,
    ) -> ProcMesh:
        """Start ``per_host`` procs on every host; returns the ``ProcMesh`` at once.

        The mesh's dimensions are the hosts' followed by ``per_host``'s, row
        major (``hosts x gpus``). ``bootstrap`` runs in each new proc before any
        actor; if it raises, ``initialized`` raises. ``proc_bind`` (as Monarch's)
        binds each proc of a host to CPUs or NUMA nodes: one dict per proc, keys
        ``cpus``, ``physcpubind``, ``cpunodebind``, ``membind`` (see
        ``danaus._runtime.hosting.binding``); a binding a host cannot apply makes
        ``initialized`` raise.

        By default each proc is forked from its host's pre-imported zygote.
        ``bootstrap_command`` (a ``BootstrapCommand``, or a callable given each
        proc's ``Point`` that returns one) starts each proc by running that
        command instead, with its ``env`` merged over the host's environment,
        so it can be wrapped (``env``, ``taskset``, ``numactl``, ``nsys
        profile``, a script that ``exec``s the rest); it must end up running
        what ``default_bootstrap_cmd()`` runs. Such procs are supervised as
        forked ones; one whose command cannot run or exits before the proc is
        up makes ``initialized`` raise ``SupervisionError`` naming the command,
        its exit status and its last lines of output.

        Raises ``TypeError`` / ``ValueError`` for a malformed ``per_host``,
        ``proc_bind`` or ``bootstrap_command``, ``FileNotFoundError`` when a
        command's program is not on this host (procs of ``this_host()``),
        ``RuntimeError`` after ``shutdown()``. Blocks only while the hosts are
        still being attached.
        """
        per_host = check_per_host(per_host, self._shape.labels)
        binds = binding.check(proc_bind, math.prod(per_host.values()))
        if self._state.shut_down:
            raise RuntimeError("HostMesh has already been shut down")
        if bootstrap is not None and not callable(bootstrap):
            raise TypeError(f"bootstrap must be a callable taking no arguments, got {bootstrap!r}")
        commands = None
        if bootstrap_command is None:
            bootstrap_command = self._command
        if bootstrap_command is not None:
            agents = self._agents()
            commands = commands_for(
                bootstrap_command,
                [*self._shape.labels, *per_host],
                [*self._shape.extent.sizes, *per_host.values()],
                local=all(a is None for a in agents),
            )
        if self._state.syncs.dsts:  # a synced workspace goes on sys.path before any actor
            bootstrap = functools.partial(
                workspace_bootstrap, list(self._state.syncs.dsts), bootstrap
            )
        node = self._node()
        ensure_registry(node)  # reachable by the procs before any of them starts
        pm = spawn_on(
            node, self._agents(), per_host, self._shape, bootstrap, name, self, binds, commands
        )
        self._state.add(pm)
        return pm

    def _check_owned(self, what: str) -> None:
        if not self._state.owned or len(self) != len(
            self._state.agents.result(config.get("attach_timeout"))
        ):
            raise RuntimeError(
                f"cannot {what} `HostMesh` that is a reference instead of owned (a slice, or a "
                "mesh received from elsewhere); only the client that attached it can"
            )

    @property
    def stream_logs(self) -> bool:
        """True: procs spawned here forward their output to the client from the start
        (aggregated, ``ProcMesh.logging_option`` changes it), on every host mesh; in
        Monarch only host meshes made with ``stream_logs`` do."""
        return True

    @property
    def is_fake_in_process(self) -> bool:
        """False: a host mesh's procs are real processes (as ``this_host()``'s in Monarch)."""
        return False

    def with_python_executable(self, python_exe: str) -> HostMesh:
        """This mesh, whose ``spawn_procs`` starts each proc with ``python_exe`` (a path,
        or a name on ``PATH``) running the proc entry module, as Monarch's: the
        command is ``default_bootstrap_cmd()`` with its program replaced. A
        ``bootstrap_command`` given to ``spawn_procs`` still wins. The Python must
        import the same danaus. Unlike Monarch's, ``this_host()`` inside those
        procs spawns with the default again. Raises ``TypeError`` for a
        ``python_exe`` that is not a non-empty ``str``; a missing one fails
        ``spawn_procs`` (``FileNotFoundError``)."""
        base = default_bootstrap_cmd()
        cmd = BootstrapCommand(python_exe, None, base.args, base.env)
        return HostMesh(self._shape, self._state, cmd)

    def sync_workspace(
        self, workspace: Workspace, conda: bool = False, auto_reload: bool = False
    ) -> Future[SyncReport]:
        """Copy ``workspace``'s directories to every host; returns a future of a ``SyncReport``.

        Each directory lands at ``ROOT/NAME`` on each host (``ROOT``: the host's
        setting ``workspace_dir``; ``NAME``: the directory's name or the one
        ``Workspace(dirs={src: NAME})`` gives). Only files whose content hash
        differs are sent (files gone locally are deleted there), over the
        mesh's authenticated connections. Then every running proc spawned
        through this mesh gets ``ROOT/NAME`` first on ``sys.path`` and reloads
        the changed modules it had imported (whatever ``auto_reload`` says);
        procs spawned later start with it on ``sys.path``. Raises ``ValueError``
        for a missing directory or overlapping names, ``NotImplementedError``
        for ``conda=True``, ``RuntimeError`` (from the future) when a changed
        module fails to reload.
        """
        if not isinstance(workspace, Workspace):
            raise TypeError(f"sync_workspace needs a Workspace, got {workspace!r}")
        if conda:
            raise NotImplementedError(
                "sync_workspace(conda=True) is not supported: danaus syncs source directories "
                "only; install the environment on the hosts (the same python_exe everywhere)"
            )
        if self._state.shut_down:
            raise RuntimeError("HostMesh has already been shut down")
        check_dirs(workspace)
        agents = tuple(self._agents())
        syncs = self._state.syncs

        def run() -> SyncReport:
            with syncs.lock:
                entry = syncs.procs.get(agents)
                if entry is None:
                    node = self._node()
                    ensure_registry(node)
                    pm = spawn_on(node, list(agents), {}, self._shape, None, "code_sync", self)
                    entry = syncs.procs[agents] = (pm, pm.spawn("danaus_code_sync", CodeSyncActor))
                dsts = list(workspace.dirs.values())
                with self._state.lock:
                    meshes = list(self._state.proc_meshes)
                report = sync(
                    entry[1],
                    meshes,
                    syncs.reloaders,
                    workspace,
                    syncs.hashes,
                )
                syncs.dsts = [*[d for d in syncs.dsts if d not in dsts], *dsts]
                return report

        return Future._create(run_in_thread(run), "the workspace to sync")

    def stop(self) -> Future[None]:
        """Stop the procs spawned through this mesh; the hosts stay up for another client."""
        futures = [pm.stop("the host mesh was stopped") for pm in self._state.take()]
        futures += self._state.syncs.stop()
        return _all_done(futures, "the host mesh's procs to stop")

    def shutdown(self) -> Future[None]:
        """Stop this mesh's procs and shut the worker hosts down. Refused on a reference."""
        self._check_owned("shut down")
        futures = [pm.stop("the host mesh was shut down") for pm in self._state.take()]
        futures += self._state.syncs.stop()
        self._state.shut_down = True
        rt = self._node().runtime
        agents = [
            a for a in self._state.agents.result(config.get("attach_timeout")) if a is not None
        ]
        stopped = _all_done(futures, "the host mesh's procs to stop")
        cf: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def shut(_: Any) -> None:  # procs first, so their exits are reported, then the hosts
            for agent in agents:
                rt.send(agent, ShutdownHost(), on_fail=lambda reason: None)
            set_future(cf, True, None)

        stopped.add_done_callback(shut)
        return Future._create(cf, "the hosts to shut down")

    async def __aenter__(self) -> HostMesh:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.shutdown()

    def __reduce__(self) -> Any:
        agents = self._state.agents.result(config.get("attach_timeout"))
        return (_rebuild, (self._shape, tuple(agents)))

    def __repr__(self) -> str:
        named = f" {self._state.name!r}" if self._state.name else ""
        return f"<HostMesh{named} {self.sizes}>"


def _rebuild(shape: Shape, agents: tuple[ProcId | None, ...]) -> HostMesh:
    cf: concurrent.futures.Future[Any] = concurrent.futures.Future()
    cf.set_result(agents)
    return HostMesh(shape, _HostState(cf, owned=False))


def _all_done(futures: list[Future[None]], what: str) -> Future[None]:
    cf: concurrent.futures.Future[Any] = concurrent.futures.Future()
    countdown = Countdown(len(futures), lambda: set_future(cf, True, None))
    for f in futures:
        f.add_done_callback(countdown.tick)
    return Future._create(cf, what)


class _Hosts:
    """This node's ``this_host()`` mesh and the transport ``enable_transport`` chose
    (a node part: a new client session starts with neither)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # guards local and transport
        self.local: HostMesh | None = None
        self.transport: str | None = None

    def on_node_end(self) -> None:
        with self.lock:
            self.local = None


def this_host() -> HostMesh:
    """The mesh of the host this code runs on (0-dimensional).

    In the client it is the local machine; inside an actor, the host the actor runs on.
    """
    node = this_node()  # the public face: the user's call holds nothing
    hosts = node.part(_Hosts)
    local = hosts.local
    if local is None:
        with hosts.lock:
            if hosts.local is None:
                cf: concurrent.futures.Future[Any] = concurrent.futures.Future()
                cf.set_result((None,))
                hosts.local = HostMesh(Shape.unity(), _HostState(cf, owned=False, node=node))
            local = hosts.local
    return local
