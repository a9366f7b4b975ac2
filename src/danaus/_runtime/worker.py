"""``run_worker_loop_forever``: serve this machine as a worker host for danaus clients."""

from __future__ import annotations

import ipaddress
import socket
import sys
from typing import Any

from .._transport.address import parse, split_tcp
from .._transport.auth import load_secret
from . import host
from .agent import run_worker

__all__ = ["run_worker_loop_forever"]


def _is_loopback(host_: str) -> bool:
    try:
        return ipaddress.ip_address(socket.gethostbyname(host_)).is_loopback
    except (OSError, ValueError):
        return False


def run_worker_loop_forever(
    *,
    address: str,
    ca: str | None = None,
    private_key: str | None = None,
    secret: str | bytes | None = None,
    secret_file: str | None = None,
    insecure: bool = False,
    on_listening: Any = None,
) -> None:
    """Run a host agent on ``address`` (``tcp://HOST:PORT``) and serve clients; never returns.

    Clients attach with ``attach_to_workers``; each client's procs are killed
    when it goes away, then the worker waits for the next. Every connection
    must prove it knows the job secret (``secret``, ``secret_file`` or
    ``$DANAUS_SECRET``). Without a secret the worker only listens on loopback
    unless ``insecure=True``. Raises ``ValueError`` for a malformed address,
    ``RuntimeError`` when refusing to run without a secret.
    """
    scheme, rest = parse(address)
    if scheme != "tcp":
        raise ValueError(f"a worker listens on TCP: expected 'tcp://HOST:PORT', got {address!r}")
    bind, port = split_tcp(rest)
    key = load_secret(secret, secret_file)
    if key is None and not insecure and not _is_loopback(bind):
        raise RuntimeError(
            f"refusing to listen on {address} without a job secret: anyone who can reach it "
            "could run code here. Give --secret-file PATH (or set DANAUS_SECRET), or pass "
            "--insecure if the network is trusted"
        )
    if ca not in (None, "trust_all_connections"):
        print(
            f"danaus worker: ca={ca!r} is ignored (authentication uses the job secret)",
            file=sys.stderr,
        )
    run_worker(bind, port, secret=key, preload=list(host.PRELOAD), on_listening=on_listening)
