"""``HostMesh``: a mesh of hosts — this one (``this_host()``) or workers joined over TCP.

A host is reached through its host agent. ``this_host()`` is the local host
(its agent starts with the first spawn); ``attach_to_workers`` joins hosts
that run ``danaus worker --listen tcp://...``. Joining authenticates with the
job secret and makes this client listen on TCP too, so the procs on those
hosts can answer it.
"""

from __future__ import annotations

import concurrent.futures
import errno
import functools
import os
import secrets
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._mesh import MeshTrait, Shape, Slice
from .._runtime import host
from .._runtime.agent import ATTACH, SHUTDOWN_HOST
from .._transport.address import join, parse, split_tcp
from .._transport.auth import load_secret
from .._wire.ids import ProcId
from .collect import Collector, Countdown, set_future
from .context import refresh_root
from .future import Future
from .procs import ProcMesh, check_per_host, spawn_on

__all__ = ["HostMesh", "attach_to_workers", "enable_transport", "this_host"]

ATTACH_TIMEOUT = 60.0
# config: how long attach_to_workers keeps retrying a worker that refuses or cannot be
# reached (still starting, e.g. under a scheduler), and its backoff between tries.
ATTACH_DEADLINE = 60.0
ATTACH_RETRY_FIRST = 0.05
ATTACH_RETRY_MAX = 2.0
# config: seconds between the progress lines naming the workers still missing.
ATTACH_PROGRESS_EVERY = 5.0


@dataclass
class _HostState:
    agents: concurrent.futures.Future[Any]  # tuple of agent ProcIds (None: this host's)
    owned: bool
    shut_down: bool = False
    proc_meshes: list[ProcMesh] = field(default_factory=list)


class HostMesh(MeshTrait):
    """A mesh of hosts; ``spawn_procs`` starts processes on each of them."""

    def __init__(self, shape: Shape, state: _HostState) -> None:
        self.__shape = shape
        self._state = state

    @property
    def _shape(self) -> Shape:
        return self.__shape

    def _new_with_shape(self, shape: Shape) -> HostMesh:
        return HostMesh(shape, self._state)

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
            agents = self._state.agents.result(ATTACH_DEADLINE + ATTACH_TIMEOUT)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(
                f"attaching to the workers took longer than {ATTACH_TIMEOUT} s"
            ) from None
        return [agents[r] for r in self._shape.ranks()]

    def spawn_procs(
        self,
        per_host: dict[str, int] | None = None,
        bootstrap: Callable[[], Any] | None = None,
        name: str | None = None,
    ) -> ProcMesh:
        """Start ``per_host`` procs on every host; returns the ``ProcMesh`` at once.

        The mesh's dimensions are the hosts' followed by ``per_host``'s, row
        major (``hosts x gpus``). ``bootstrap`` runs in each new proc before any
        actor; if it raises, ``initialized`` raises. Raises ``TypeError`` /
        ``ValueError`` for a malformed ``per_host``, ``RuntimeError`` after
        ``shutdown()``. Blocks only while the hosts are still being attached.
        """
        per_host = check_per_host(per_host, self._shape.labels)
        if self._state.shut_down:
            raise RuntimeError("HostMesh has already been shut down")
        pm = spawn_on(self._agents(), per_host, self._shape, bootstrap, name, self)
        self._state.proc_meshes.append(pm)
        return pm

    def _check_owned(self, what: str) -> None:
        if not self._state.owned or len(self) != len(self._state.agents.result(ATTACH_TIMEOUT)):
            raise RuntimeError(
                f"cannot {what} `HostMesh` that is a reference instead of owned (a slice, or a "
                "mesh received from elsewhere); only the client that attached it can"
            )

    def stop(self) -> Future[None]:
        """Stop the procs spawned through this mesh; the hosts stay up for another client."""
        futures = [pm.stop("the host mesh was stopped") for pm in self._state.proc_meshes]
        self._state.proc_meshes.clear()
        return _all_done(futures, "the host mesh's procs to stop")

    def shutdown(self) -> Future[None]:
        """Stop this mesh's procs and shut the worker hosts down. Refused on a reference."""
        self._check_owned("shut down")
        futures = [pm.stop("the host mesh was shut down") for pm in self._state.proc_meshes]
        self._state.proc_meshes.clear()
        self._state.shut_down = True
        rt = host.ensure_runtime()
        agents = [a for a in self._state.agents.result(ATTACH_TIMEOUT) if a is not None]
        stopped = _all_done(futures, "the host mesh's procs to stop")
        cf: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def shut(_: Any) -> None:  # procs first, so their exits are reported, then the hosts
            for agent in agents:
                rt.send(agent, (SHUTDOWN_HOST,), on_fail=lambda reason: None)
            set_future(cf, True, None)

        stopped.add_done_callback(shut)
        return Future._create(cf, "the hosts to shut down")

    async def __aenter__(self) -> HostMesh:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.shutdown()

    def __reduce__(self) -> Any:
        agents = self._state.agents.result(ATTACH_TIMEOUT)
        return (_rebuild, (self._shape, tuple(agents)))

    def __repr__(self) -> str:
        return f"<HostMesh {self.sizes}>"


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


_local: HostMesh | None = None


def this_host() -> HostMesh:
    """The mesh of the host this code runs on (0-dimensional).

    In the client it is the local machine; inside an actor, the host the actor runs on.
    """
    global _local
    if _local is None:
        cf: concurrent.futures.Future[Any] = concurrent.futures.Future()
        cf.set_result((None,))
        _local = HostMesh(Shape.unity(), _HostState(cf, owned=False))
    return _local


# -- joining workers ------------------------------------------------------------

_transport_lock = threading.Lock()
_transport: str | None = None


def enable_transport(transport: str) -> None:
    """Choose how this client is reached by other hosts; call before first use.

    ``"tcp"`` (the default for attached workers) or ``"tcp://ADDR:PORT"`` to
    advertise (and listen on) a given address. Enabling the same again is a
    no-op; a different one raises ``RuntimeError``.
    """
    global _transport
    if transport not in ("tcp", "ipc", "unix") and not transport.startswith("tcp://"):
        raise ValueError(f"unsupported transport {transport!r}; use 'tcp' or 'tcp://ADDR:PORT'")
    if transport.startswith("tcp://"):
        split_tcp(transport[len("tcp://") :])
    with _transport_lock:
        if _transport is not None and _transport != transport:
            raise RuntimeError(
                f"the transport is already {_transport!r}; enable_transport({transport!r}) must "
                "come before first use and cannot change it"
            )
        _transport = transport


def _advertise_for(first_worker: tuple[str, int]) -> tuple[str, str, int]:
    """``(bind, advertise, port)`` for this client's TCP listener."""
    override = os.environ.get("DANAUS_ADVERTISE_ADDR") or (
        _transport[len("tcp://") :] if _transport and _transport.startswith("tcp://") else None
    )
    if override:
        if ":" in override and override.rsplit(":", 1)[1].isdigit():
            host_, port = split_tcp(override)
        else:
            host_, port = override, 0
        return "0.0.0.0", host_, port
    # The address this host uses to reach the worker is one the worker can reach back.
    family = socket.AF_INET6 if ":" in first_worker[0] else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect(first_worker)  # UDP: picks a route, sends nothing
        ip = s.getsockname()[0]
    return ("::" if family == socket.AF_INET6 else "0.0.0.0"), ip, 0


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
    hosts. ``secret`` (else ``$DANAUS_SECRET``) authenticates every connection;
    ``ca`` is accepted for Monarch compatibility (``"trust_all_connections"``).
    Raises ``ValueError`` for malformed addresses.

    Example::

        hosts = attach_to_workers(workers=["tcp://10.0.0.2:26600", "tcp://10.0.0.3:26600"])
        procs = hosts.spawn_procs(per_host={"gpus": 8})
    """
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
    if key is not None:
        if rt.secret is not None and rt.secret != key:
            raise RuntimeError("this client already uses another job secret")
        rt.secret = key
    bind, advertise, port = _advertise_for(hostports[0])
    rt.listen_tcp(bind, advertise, port)
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
            value = f"{value} (still unreachable after {ATTACH_DEADLINE:g} s of retrying; " + (
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
            (ATTACH, rt.proc_id, collector.port),
            on_fail=functools.partial(collector.fail, 0),
        )

    for i, addr in enumerate(addrs):
        attempt(i, addr, ATTACH_RETRY_FIRST)
    shape = Shape(["hosts"], Slice.new_row_major([len(addrs)]))
    return HostMesh(shape, _HostState(cf, owned=True))


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
        self._lock = threading.Lock()
        self._missing = dict.fromkeys(addrs)
        self._deadline = time.monotonic() + ATTACH_DEADLINE
        self._next_line = time.monotonic() + ATTACH_PROGRESS_EVERY

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
                self._next_line = now + ATTACH_PROGRESS_EVERY
                left = self._deadline - now
                line = (
                    f"danaus: waiting for {len(self._missing)} worker(s) still starting "
                    f"({left:.0f} s left): {', '.join(self._missing)}"
                )
        if line is not None:
            print(line, file=sys.stderr, flush=True)
        return True
