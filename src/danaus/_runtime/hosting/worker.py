"""``run_worker_loop_forever``: serve this machine as a worker host for danaus clients."""

from __future__ import annotations

import ipaddress
import socket
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..._transport.address import parse, split_tcp
from ..._transport.auth import load_secret
from ..._transport.secret_env import forget_environ_secret
from .. import node
from .agent import run_worker

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["WorkerPlan", "plan_worker", "print_warnings", "run_worker_loop_forever", "serve_worker"]


def _is_loopback(host_: str) -> bool:
    try:
        return ipaddress.ip_address(socket.gethostbyname(host_)).is_loopback
    except (OSError, ValueError):
        return False


@dataclass(frozen=True)
class WorkerPlan:
    """A worker's checked settings: where it binds, its secret, what it must warn about."""

    bind: str
    port: int
    secret: bytes | None
    warnings: tuple[str, ...]


def plan_worker(
    *,
    address: str,
    ca: str | None = None,
    secret: str | bytes | None = None,
    secret_file: str | None = None,
    insecure: bool = False,
) -> WorkerPlan:
    """Check a worker's settings before it starts (``danaus worker --detach`` does this
    before detaching, so that refusals and warnings reach the user's terminal).

    Does not block. Raises as [`run_worker_loop_forever()`][danaus.actor.run_worker_loop_forever].
    """
    scheme, rest = parse(address)
    if scheme != "tcp":
        raise ValueError(f"a worker listens on TCP: expected 'tcp://HOST:PORT', got {address!r}")
    bind, port = split_tcp(rest)
    key = load_secret(secret, secret_file)
    # Held in memory from here on: out of this process's environment, so that neither
    # /proc/PID/environ nor the zygote and procs it forks (they inherit it) show it.
    forget_environ_secret()
    if key is None and not insecure:
        where = "even on loopback, every local user can reach it" if _is_loopback(bind) else ""
        raise RuntimeError(
            f"refusing to listen on {address} without a job secret: anyone who can reach it "
            f"could run code here{' (' + where + ')' if where else ''}. Give --secret-file PATH "
            "(a file only you can read: chmod 600 PATH) or set DANAUS_SECRET, or pass "
            "--insecure if every user who can reach the port is trusted"
        )
    warnings = []
    if key is None:
        warnings.append(
            f"danaus worker: WARNING: --insecure: listening on {address} without a job "
            "secret; anyone who can reach this port can run code as this user"
        )
    if ca not in (None, "trust_all_connections"):
        warnings.append(f"danaus worker: ca={ca!r} is ignored (authentication uses the job secret)")
    return WorkerPlan(bind, port, key, tuple(warnings))


def print_warnings(plan: WorkerPlan) -> None:
    """Write the plan's warnings to stderr."""
    for line in plan.warnings:
        print(line, file=sys.stderr, flush=True)


def serve_worker(plan: WorkerPlan, on_listening: Callable[[str], None] | None = None) -> None:
    """Run a host agent as ``plan`` says (its warnings first, to stderr); never returns."""
    print_warnings(plan)
    run_worker(
        plan.bind,
        plan.port,
        secret=plan.secret,
        insecure=plan.secret is None,
        preload=list(node.preload_modules()),
        on_listening=on_listening,
    )


def run_worker_loop_forever(
    *,
    address: str,
    ca: str | None = None,
    private_key: str | None = None,
    secret: str | bytes | None = None,
    secret_file: str | None = None,
    insecure: bool = False,
    on_listening: Callable[[str], None] | None = None,
) -> None:
    """Run a host agent on ``address`` (``tcp://HOST:PORT``) and serve clients; never returns.

    Clients attach with ``attach_to_workers``; each client's procs are killed
    when it goes away, then the worker waits for the next. Every connection
    must prove it knows the job secret (``secret``, ``secret_file`` or
    ``$DANAUS_SECRET``; the variable is then removed from this process's
    environment, ``/proc/PID/environ`` included). Without a secret the worker
    refuses to start (loopback included: other local users reach it) unless
    ``insecure=True``, and then warns on stderr. Raises ``ValueError`` for a malformed address or an
    unsafe secret file, ``RuntimeError`` when refusing to run without a secret.
    """
    plan = plan_worker(
        address=address, ca=ca, secret=secret, secret_file=secret_file, insecure=insecure
    )
    serve_worker(plan, on_listening)
