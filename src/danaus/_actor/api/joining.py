"""Joining workers: a client attaches to ``danaus worker`` processes (``attach``,
``attach_to_workers``) over the transport ``enable_transport`` chose, retrying a worker
that is not up yet."""

from __future__ import annotations

import concurrent.futures
import enum
import errno
import functools
import os
import secrets
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from ... import _config as config
from ..._mesh import Shape, Slice
from ..._runtime import node as _node
from ..._runtime.hosting import host
from ..._runtime.node import this_node
from ..._transport.address import join, parse, split_tcp
from ..._transport.auth import load_secret
from ..._wire.ids import ProcId
from ..._wire.protocol import Attach
from ..core.collect import Collector, Countdown, set_future
from ..core.context import refresh_root
from ..core.future import Future
from .hosts import HostMesh, _Hosts, _HostState

__all__ = ["ChannelTransport", "attach", "attach_to_workers", "enable_transport"]

# Backoff between tries of a worker that refuses or cannot be reached yet.
ATTACH_RETRY_FIRST = 0.05
ATTACH_RETRY_MAX = 2.0


def _chosen_transport() -> str | None:
    """What ``enable_transport`` chose for this client session, if anything (starts
    no session: without one, nothing was chosen)."""
    node = this_node(start=False)
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
    hosts = this_node().part(_Hosts)
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

    Example:

        attach("tcp://10.0.0.2:26600")
        hosts = attach_to_workers(workers=["tcp://10.0.0.2:26600", "tcp://10.0.0.3:26600"])
    """
    if not isinstance(addr, str) or not addr.startswith("tcp://"):
        raise ValueError(
            f"attach(addr): addr must be a worker's address 'tcp://HOST:PORT', got {addr!r}"
        )
    split_tcp(parse(addr)[1])  # ValueError for a malformed host or port
    with _node.lock():
        if this_node(start=False) is not None:
            raise RuntimeError(
                "client already bootstrapped; call attach(addr) before "
                "the first context()/this_host()/this_proc()"
            )
        node = this_node()
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
    refresh_root(node)


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

    Example:

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
    node = this_node()
    rt = node.runtime
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
        host.share_secret(node, key)
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
    refresh_root(node)
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
        if rt.peers.is_lost(value["name"]) is not None:
            rt.peers.forget_peer(value["name"])  # the same worker, back after a partition
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
    return HostMesh(shape, _HostState(cf, owned=True, name=name, node=node))


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
