"""``HostMesh``: a mesh of hosts — this one (``this_host()``) or workers joined over TCP.

A host is reached through its host agent. ``this_host()`` is the local host
(its agent starts with the first spawn); ``attach_to_workers`` joins hosts
that run ``danaus worker --listen tcp://...``. Joining authenticates with the
job secret and makes this client listen on TCP too, so the procs on those
hosts can answer it.
"""

from __future__ import annotations

import concurrent.futures
import enum
import errno
import functools
import math
import os
import secrets
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ... import _config as config
from ..._mesh import MeshTrait, Point, Shape, Slice
from ..._runtime import node as _node
from ..._runtime.hosting import binding, host
from ..._transport.address import join, parse, split_tcp
from ..._transport.auth import load_secret
from ..._wire.ids import ProcId
from ..._wire.protocol import Attach, ShutdownHost
from ..core.collect import Collector, Countdown, set_future
from ..core.context import refresh_root
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

__all__ = [
    "ChannelTransport",
    "HostMesh",
    "attach",
    "attach_to_workers",
    "enable_transport",
    "this_host",
]

# Backoff between tries of a worker that refuses or cannot be reached yet.
ATTACH_RETRY_FIRST = 0.05
ATTACH_RETRY_MAX = 2.0


@dataclass
class _HostState:
    agents: concurrent.futures.Future[Any]  # tuple of agent ProcIds (None: this host's)
    owned: bool
    shut_down: bool = False
    name: str | None = None  # attach_to_workers(name=...): how the mesh shows itself
    proc_meshes: list[ProcMesh] = field(default_factory=list)
    syncs: _Syncs = field(default_factory=_Syncs)  # sync_workspace's procs and directories


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
        ensure_registry()  # reachable by the procs before any of them starts
        pm = spawn_on(self._agents(), per_host, self._shape, bootstrap, name, self, binds, commands)
        self._state.proc_meshes.append(pm)
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
                    ensure_registry()
                    pm = spawn_on(list(agents), {}, self._shape, None, "code_sync", self)
                    entry = syncs.procs[agents] = (pm, pm.spawn("danaus_code_sync", CodeSyncActor))
                dsts = list(workspace.dirs.values())
                report = sync(
                    entry[1],
                    list(self._state.proc_meshes),
                    syncs.reloaders,
                    workspace,
                    syncs.hashes,
                )
                syncs.dsts = [*[d for d in syncs.dsts if d not in dsts], *dsts]
                return report

        return Future._create(run_in_thread(run), "the workspace to sync")

    def stop(self) -> Future[None]:
        """Stop the procs spawned through this mesh; the hosts stay up for another client."""
        futures = [pm.stop("the host mesh was stopped") for pm in self._state.proc_meshes]
        futures += self._state.syncs.stop()
        self._state.proc_meshes.clear()
        return _all_done(futures, "the host mesh's procs to stop")

    def shutdown(self) -> Future[None]:
        """Stop this mesh's procs and shut the worker hosts down. Refused on a reference."""
        self._check_owned("shut down")
        futures = [pm.stop("the host mesh was shut down") for pm in self._state.proc_meshes]
        futures += self._state.syncs.stop()
        self._state.proc_meshes.clear()
        self._state.shut_down = True
        rt = host.ensure_runtime()
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
    hosts = host.ensure_node().part(_Hosts)
    local = hosts.local
    if local is None:
        with hosts.lock:
            if hosts.local is None:
                cf: concurrent.futures.Future[Any] = concurrent.futures.Future()
                cf.set_result((None,))
                hosts.local = HostMesh(Shape.unity(), _HostState(cf, owned=False))
            local = hosts.local
    return local


# -- joining workers ------------------------------------------------------------


def _chosen_transport() -> str | None:
    """What ``enable_transport`` chose for this client session, if anything (starts
    no session: without one, nothing was chosen)."""
    node = host.current_node()
    return None if node is None else node.part(_Hosts).transport


class ChannelTransport(enum.Enum):
    """Monarch's transport kinds, for ``enable_transport(ChannelTransport.Unix)``.

    danaus serves ``Unix`` (as ``"ipc"``) and both TCP kinds (as ``"tcp"``);
    ``enable_transport`` raises ``NotImplementedError`` for the others (TLS is
    configured with ``DANAUS_TLS_*``; ``Local`` is Monarch's in-process channel).
    """

    TcpWithLocalhost = "tcp(localhost)"
    TcpWithHostname = "tcp(hostname)"
    MetaTlsWithHostname = "metatls(hostname)"
    MetaTlsWithIpV6 = "metatls(ipv6)"
    Tls = "tls"
    Local = "local"
    Unix = "unix"


_FROM_ENUM = {
    ChannelTransport.Unix: "ipc",
    ChannelTransport.TcpWithLocalhost: "tcp",
    ChannelTransport.TcpWithHostname: "tcp",
}


def enable_transport(transport: str | ChannelTransport) -> None:
    """Choose how this client is reached by other hosts; call before first use.

    ``"tcp"`` (the default for attached workers) or ``"tcp://ADDR:PORT"`` to
    advertise (and listen on) a given address. ``"ipc"`` (alias ``"unix"``)
    keeps every connection on this host, over Unix sockets — what procs of
    ``this_host()`` always use — so a later ``attach_to_workers`` raises
    ``RuntimeError``. Enabling the same again is a no-op; a different one
    raises ``RuntimeError``; an unknown one ``ValueError``. Never blocks.
    """
    if isinstance(transport, ChannelTransport):
        if transport not in _FROM_ENUM:
            raise NotImplementedError(
                f"enable_transport({transport}) is not supported; use ChannelTransport.Unix or "
                "a TCP kind (TLS is configured with DANAUS_TLS_CERT/DANAUS_TLS_KEY/DANAUS_TLS_CA)"
            )
        transport = _FROM_ENUM[transport]
    if transport == "unix":
        transport = "ipc"  # one name, so that enabling either twice is a no-op
    if not isinstance(transport, str) or (
        transport not in ("tcp", "ipc", "unix") and not transport.startswith("tcp://")
    ):
        raise ValueError(
            f"unsupported transport {transport!r}; use 'tcp', 'tcp://ADDR:PORT' or 'ipc' "
            "(TLS is configured with DANAUS_TLS_CERT/DANAUS_TLS_KEY/DANAUS_TLS_CA, not here)"
        )
    if transport.startswith("tcp://"):
        split_tcp(transport[len("tcp://") :])
    hosts = host.ensure_node().part(_Hosts)
    with hosts.lock:
        if hosts.transport is not None and hosts.transport != transport:
            raise RuntimeError(
                f"the transport is already {hosts.transport!r}; enable_transport({transport!r}) "
                "must come before first use and cannot change it"
            )
        hosts.transport = transport


def _source_ip(worker: tuple[str, int]) -> str:
    """The address this host uses to reach ``worker``: one the worker can reach back."""
    family = socket.AF_INET6 if ":" in worker[0] else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect(worker)  # UDP: picks a route, sends nothing
        ip: str = s.getsockname()[0]
    return ip


def _advertise_for(first_worker: tuple[str, int]) -> tuple[str, str, int]:
    """``(bind, advertise, port)`` for this client's TCP listener.

    It listens on the interface the workers are reached through, never on every
    interface (a listener on 0.0.0.0 is reachable from networks the job never uses).
    """
    ip = _source_ip(first_worker)
    chosen = _chosen_transport()
    override = config.get("advertise_addr") or (
        chosen[len("tcp://") :] if chosen and chosen.startswith("tcp://") else None
    )
    if override:
        if ":" in override and override.rsplit(":", 1)[1].isdigit():
            host_, port = split_tcp(override)
        else:
            host_, port = override, 0
        return ip, host_, port  # e.g. an address behind NAT: bind locally, advertise it
    return ip, ip, 0


def attach(addr: str) -> None:
    """Bootstrap this client through the worker at ``addr`` (``"tcp://HOST:PORT"``).

    The client dials out to that worker (its *gateway*) and sends all of its
    traffic with procs on other hosts over that one connection; procs reach
    the client back through it. So the procs need not reach the client: e.g.
    a client outside a cluster (or behind NAT) whose workers run inside it.
    ``this_host()`` still names this machine; its procs are reached through the
    gateway too. Losing the gateway loses every proc reached through it: their
    calls fail with ``SupervisionError``.

    Call it before anything else uses danaus in this process (the first
    ``context()``, ``this_host()``, ``this_proc()`` or ``attach_to_workers``);
    then join the workers, the gateway among them, with ``attach_to_workers``.
    The job secret comes from ``DANAUS_SECRET``. Raises ``RuntimeError`` if the
    client already bootstrapped or the worker cannot be reached or refuses,
    ``ValueError`` for an address that is not ``tcp://HOST:PORT``.

    Example::

        attach("tcp://10.0.0.2:26600")
        hosts = attach_to_workers(workers=["tcp://10.0.0.2:26600", "tcp://10.0.0.3:26600"])
    """
    if not isinstance(addr, str) or not addr.startswith("tcp://"):
        raise ValueError(
            f"attach(addr): addr must be a worker's address 'tcp://HOST:PORT', got {addr!r}"
        )
    split_tcp(parse(addr)[1])  # ValueError for a malformed host or port
    with _node.lock():
        if host.current_node() is not None:
            raise RuntimeError(
                "client already bootstrapped; call attach(addr) before "
                "the first context()/this_host()/this_proc()"
            )
        node = host.ensure_node()
        rt = node.runtime
        try:
            key = load_secret(None)
            if key is not None:
                rt.set_secret(key)
            elif _insecure():
                rt.allow_insecure()
            else:
                raise RuntimeError(
                    f"attach({addr!r}) needs the job secret the worker was started with: "
                    "set DANAUS_SECRET"
                )
            rt.relay.attach(addr, config.get("attach_timeout"))
        except BaseException:
            host.shutdown(node)  # not bootstrapped after all: a later use starts afresh
            raise
    refresh_root()


def attach_to_workers(
    *,
    workers: Sequence[str | Future[str]],
    name: str | None = None,
    ca: str | None = None,
    secret: str | bytes | None = None,
    private_key: str | None = None,
) -> HostMesh:
    """Join hosts running ``danaus worker``; returns a ``HostMesh`` with dimension ``hosts``.

    Returns at once; ``initialized`` (or the first ``spawn_procs``) waits for the
    hosts. ``name`` names the host mesh (it shows in its ``repr``). ``secret``
    (else ``$DANAUS_SECRET``) authenticates every connection; ``ca`` is accepted
    for Monarch compatibility (``"trust_all_connections"``). Raises
    ``ValueError`` for malformed addresses, ``NotImplementedError`` for
    ``private_key`` (TLS keys come from ``DANAUS_TLS_KEY``), ``RuntimeError``
    after ``enable_transport("ipc")``.

    Example::

        hosts = attach_to_workers(workers=["tcp://10.0.0.2:26600", "tcp://10.0.0.3:26600"])
        procs = hosts.spawn_procs(per_host={"gpus": 8})
    """
    if private_key is not None:
        raise NotImplementedError(
            f"attach_to_workers(private_key={private_key!r}) is not supported: danaus "
            "authenticates with the job secret (secret= or DANAUS_SECRET) and encrypts with "
            "mutual TLS whose files come from DANAUS_TLS_CERT, DANAUS_TLS_KEY and DANAUS_TLS_CA; "
            "drop private_key and set those instead"
        )
    if name is not None and not isinstance(name, str):
        raise TypeError(f"name must be a str or None, got {name!r}")
    if _chosen_transport() == "ipc":
        raise RuntimeError(
            "enable_transport('ipc') keeps this client on this host, so it cannot "
            "attach to workers; call enable_transport('tcp') (or nothing) instead"
        )
    if isinstance(workers, str) or not workers:
        raise ValueError(f"workers must be a non-empty list of 'tcp://HOST:PORT', got {workers!r}")
    addrs = [w.get() if isinstance(w, Future) else w for w in workers]
    hostports = []
    for a in addrs:
        if not isinstance(a, str) or not a.startswith("tcp://"):
            raise ValueError(f"worker address {a!r} is not of the form 'tcp://HOST:PORT'")
        hostports.append(split_tcp(parse(a)[1]))
    rt = host.ensure_runtime()
    key = load_secret(secret)
    if key is None and rt.secret is None and not _insecure():
        raise RuntimeError(
            "attach_to_workers needs the job secret the workers were started with: pass "
            "secret=... or set DANAUS_SECRET (the workers read it from --secret-file or "
            "DANAUS_SECRET). Without one, anyone who reaches this client's port could run code "
            "in it. Make one with: python -c 'import secrets; print(secrets.token_hex(32))'"
        )
    if key is not None:
        if rt.secret is not None and rt.secret != key:
            raise RuntimeError("this client already uses another job secret")
        rt.set_secret(key)
        host.share_secret(key)
    newly_insecure = key is None and rt.secret is None and not rt.insecure
    if newly_insecure:
        rt.allow_insecure()
    if rt.relay.via is None:  # attached through a gateway (attach): no port of our own
        bind, advertise, port = _advertise_for(hostports[0])
        rt.listen_tcp(bind, advertise, port)
        if newly_insecure:
            _warn_insecure(rt.proc_id.addr)
        for hp in hostports:  # workers reached through other interfaces reach us back there
            rt.listen_tcp_also(_source_ip(hp))
    refresh_root()
    agents: list[ProcId | None] = [None] * len(addrs)
    cf: concurrent.futures.Future[Any] = concurrent.futures.Future()
    countdown = Countdown(len(addrs), lambda: set_future(cf, True, tuple(agents)))
    waiting = _Waiting(addrs)

    def one(i: int, addr: str, delay: float, ok: bool, value: Any) -> None:
        if not ok and _not_up_yet(value) and not cf.done():
            if waiting.retry(addr):
                timer = threading.Timer(delay, attempt, (i, addr, min(2 * delay, ATTACH_RETRY_MAX)))
                timer.daemon = True
                timer.start()
                return
            deadline = config.get("attach_retry_deadline")
            value = (
                f"{value} (still unreachable after {deadline:g} s of retrying; "
                f"missing: {', '.join(waiting.missing())})"
            )
        if not ok:
            err = RuntimeError(
                f"attach failed: worker {addr}: {value}. Check that the worker runs and that "
                "client and worker use the same job secret (DANAUS_SECRET)"
            )
            set_future(cf, False, err)
            return
        waiting.arrived(addr)
        if rt.is_lost(value["name"]) is not None:
            rt.forget_peer(value["name"])  # the same worker, back after a partition
        agents[i] = ProcId(value["name"], join(addr, f"host:{value['host']}"))
        countdown.tick()

    def attempt(i: int, addr: str, delay: float) -> None:
        if cf.done():
            return
        provisional = ProcId(f"attach-{secrets.token_hex(3)}", addr)
        on_value = functools.partial(_skip, one, i, addr, delay)
        collector = Collector(rt, f"attaching to {addr}", 1, on_value)
        collector.expect(0, provisional)
        rt.send(
            provisional,
            Attach(rt.proc_id, collector.port),
            on_fail=functools.partial(collector.fail, 0),
        )

    for i, addr in enumerate(addrs):
        attempt(i, addr, ATTACH_RETRY_FIRST)
    shape = Shape(["hosts"], Slice.new_row_major([len(addrs)]))
    return HostMesh(shape, _HostState(cf, owned=True, name=name))


def _insecure() -> bool:
    """The explicit opt-out for workers run with ``--insecure`` (a trusted network only)."""
    return bool(config.get("insecure"))


def _warn_insecure(addr: str) -> None:
    """Say on the user's terminal that this client runs without authentication (as the
    ``--insecure`` worker does)."""
    where = ", ".join(a for a in addr.split(";") if a.startswith("tcp://")) or addr
    print(
        f"danaus: WARNING: DANAUS_INSECURE=1: this client listens on {where} without a job "
        "secret, as do its workers; anyone who can reach these ports can run code as this "
        "user",
        file=sys.stderr,
        flush=True,
    )


def _skip(
    fn: Callable[..., None], i: int, addr: str, delay: float, _index: int, ok: bool, v: Any
) -> None:
    fn(i, addr, delay, ok, v)


_NOT_UP = tuple(os.strerror(e) for e in (errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH))


def _not_up_yet(error: Any) -> bool:
    """True when attaching failed because nothing answered yet (refused, no route).

    Also when the worker still serves a client: the previous client may have just
    exited (a reconnecting client), which the worker notices a moment later.
    """
    reason = str(getattr(error, "reason", ""))
    if reason.startswith("cannot connect to proc") or any(e in reason for e in _NOT_UP):
        return True
    return "a worker serves one client at a time" in str(error)


class _Waiting:
    """The workers not attached yet: the retry deadline and the progress line naming them."""

    def __init__(self, addrs: Sequence[str]) -> None:
        self._lock = threading.Lock()  # guards _missing and the next progress line's time
        self._missing = dict.fromkeys(addrs)
        self._deadline = time.monotonic() + config.get("attach_retry_deadline")
        self._next_line = time.monotonic() + config.get("attach_progress_every")

    def missing(self) -> list[str]:
        with self._lock:
            return list(self._missing)

    def arrived(self, addr: str) -> None:
        with self._lock:
            self._missing.pop(addr, None)

    def retry(self, addr: str) -> bool:
        """Whether to try ``addr`` again; prints the progress line when one is due."""
        now = time.monotonic()
        with self._lock:
            if now >= self._deadline:
                return False
            line = None
            if now >= self._next_line:
                self._next_line = now + config.get("attach_progress_every")
                left = self._deadline - now
                line = (
                    f"danaus: waiting for {len(self._missing)} worker(s) still starting "
                    f"({left:.0f} s left): {', '.join(self._missing)}"
                )
        if line is not None:
            print(line, file=sys.stderr, flush=True)
        return True
