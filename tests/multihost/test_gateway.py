"""``attach(addr)``: a client that the procs cannot reach, attached through a gateway.

The workers run on hosts of their own whose routing forbids every connection
toward the client's address (``ip rule ... prohibit``), except the gateway
worker's answers on its listening port: so the client can dial the gateway,
and nothing on those hosts can dial the client. The client runs in a
subprocess (``gateway_client.py``); the pytest process is never attached.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from danaus.actor import attach, context

from .conftest import IP, TIMEOUT, Host, Network, Worker, client_env

CLIENT = Path(__file__).with_name("gateway_client.py")


def _unreachable_client(host: Host, client_ip: str, answer_port: int | None) -> None:
    """Forbid ``host`` every route to ``client_ip``, except its answers from ``answer_port``."""
    ns = ["-n", host.netns]
    if answer_port is not None:
        rule = ["rule", "add", "priority", "100", "to", client_ip, "ipproto", "tcp"]
        subprocess.run(
            [IP, *ns, *rule, "sport", str(answer_port), "lookup", "main"], check=True, timeout=20
        )
    subprocess.run(
        [IP, *ns, "rule", "add", "priority", "200", "to", client_ip, "prohibit"],
        check=True,
        timeout=20,
    )


@pytest.fixture
def walled(network: Network, fresh_worker: Callable[..., Worker]) -> tuple[Worker, Worker, str]:
    """``(gateway, other, client_ip)``: two workers on hosts that cannot reach the client."""
    gateway, other = fresh_worker(), fresh_worker()
    client_ip = network.gateway  # the bridge's address: the client's, as the hosts see it
    _unreachable_client(gateway.host, client_ip, int(gateway.address.rsplit(":", 1)[1]))
    _unreachable_client(other.host, client_ip, None)
    return gateway, other, client_ip


def _client(mode: str, *args: str, secret: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(CLIENT), mode, *args],
        env={**client_env(), "DANAUS_SECRET": secret},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _result(proc: subprocess.Popen[str], stdin: str = "") -> dict[str, Any]:
    out, err = proc.communicate(stdin, timeout=6 * TIMEOUT)
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"the client failed ({proc.returncode}):\n{out}\n{err}"
    result: dict[str, Any] = json.loads(lines[-1][len("RESULT ") :])
    return result


def test_an_attached_client_reaches_procs_that_cannot_reach_it_and_they_reach_it_back(
    walled: tuple[Worker, Worker, str], secret: str
) -> None:
    gateway, other, client_ip = walled
    r = _result(_client("relay", gateway.address, other.address, client_ip, secret=secret))
    # The client advertises the gateway's relay port, and no TCP address of its own.
    entries = r["address"].split(";")
    assert not [e for e in entries if e.startswith("tcp://")], entries
    [via] = [e for e in entries if e.startswith("via:")]
    assert via.startswith(f"via:tcp://{gateway.host.ip}:"), via
    assert r["again"] == (
        "client already bootstrapped; call attach(addr) before "
        "the first context()/this_host()/this_proc()"
    )
    # Procs on both hosts answer, in their hosts' namespaces, in order.
    assert r["echo"] == ["hi"] * 4
    inodes = [f"net:[{h.netns_inode}]" for h in (gateway.host, other.host) for _ in range(2)]
    assert r["netns"] == inodes
    assert r["recorded"] == [list(range(200))] * 4
    # None of them can open a connection to the client's address.
    assert len(r["dial"]) == 4
    assert all(d.startswith("failed:") for d in r["dial"]), r["dial"]
    # this_host() is the client's machine; its procs and the client's own actors are
    # called from the workers' hosts, back through the gateway.
    assert r["local_netns"] == r["client_netns"]
    assert r["local"] == "from-client"
    assert r["to_local"] == ["through-remote"] * 4
    assert r["to_client"] == ["to-this-proc"] * 4


def test_losing_the_gateway_fails_the_calls_pending_through_it(
    walled: tuple[Worker, Worker, str], secret: str
) -> None:
    gateway, other, client_ip = walled
    client = _client("kill", gateway.address, other.address, client_ip, secret=secret)
    assert client.stdout is not None
    line = client.stdout.readline()
    assert line == "HOLDING\n", line + (client.stderr.read() if client.stderr else "")
    gateway.kill()
    r = _result(client, "killed\n")
    # Both calls fail, the one to the worker that still runs included: its route is gone.
    assert len(r["pending"]) == 2
    assert all(p.startswith("SupervisionError") for p in r["pending"]), r["pending"]
    assert all("lost the gateway connection" in p for p in r["pending"]), r["pending"]
    assert r["later"].startswith("SupervisionError"), r["later"]
    assert "lost the gateway connection" in r["later"], r["later"]


def test_attach_refuses_what_is_no_worker_address() -> None:
    for bad in ("ipc:///tmp/sock", "tcp://no-port", "10.0.0.1:26600", 26600):
        with pytest.raises(ValueError, match="tcp://HOST:PORT"):
            attach(bad)  # type: ignore[arg-type]


def test_attach_after_the_client_bootstrapped_raises() -> None:
    context()  # this process's client is up (the check comes before any dial)
    with pytest.raises(RuntimeError, match="client already bootstrapped"):
        attach("tcp://127.0.0.1:9")


def test_attach_to_nothing_says_why_and_bootstraps_nothing(secret: str) -> None:
    r = _result(_client("errors", "tcp://127.0.0.1:9", secret=secret))
    assert r["unreachable"].startswith("attach('tcp://127.0.0.1:9') failed:"), r
    assert "danaus worker" in r["unreachable"]
    assert r["after_bootstrap"].startswith("client already bootstrapped"), r
