"""A client that attaches through a gateway worker (``attach``), run as a script.

``python gateway_client.py MODE GATEWAY OTHER CLIENT_IP`` (the tests of
``test_gateway.py`` run it in a subprocess: the pytest process itself is never
attached). It prints one line ``RESULT <json>`` with what it saw; in mode
``kill`` it first prints ``HOLDING`` once its calls wait on both workers, and
reads a line from stdin before it starts waiting for their answers (the
gateway is killed meanwhile).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
from typing import Any

import danaus.actor
from danaus.actor import (
    Actor,
    SupervisionError,
    attach,
    attach_to_workers,
    context,
    endpoint,
    this_host,
    this_proc,
)

TIMEOUT = 30.0


class Echo(Actor):
    def __init__(self) -> None:
        self.log: list[int] = []

    @endpoint
    def echo(self, value: Any) -> Any:
        return value

    @endpoint
    def record(self, seq: int) -> None:
        self.log.append(seq)

    @endpoint
    def recorded(self) -> list[int]:
        return list(self.log)

    @endpoint
    def netns(self) -> str:
        return os.readlink("/proc/self/ns/net")

    @endpoint
    def dial(self, ip: str, port: int) -> str:
        """Try to open a TCP connection straight to ``ip:port``: what happened."""
        try:
            with socket.create_connection((ip, port), timeout=TIMEOUT):
                return "connected"
        except OSError as e:
            return f"failed: {e}"


class Relay(Actor):
    """Calls an actor it was handed, from wherever it runs."""

    def __init__(self, target: Any) -> None:
        self.target = target

    @endpoint
    def relay(self, message: str) -> Any:
        return self.target.echo.call_one(message).get(timeout=TIMEOUT)


class Holder(Actor):
    """Answers ``hold`` never: a call that is pending when its proc's route is lost."""

    def __init__(self) -> None:
        self.never = threading.Event()

    @endpoint
    def hold(self) -> None:
        self.never.wait()


def relay(gateway: str, other: str, client_ip: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    attach(gateway)
    out["address"] = context().actor_instance.actor_id.addr
    try:
        attach(gateway)
    except RuntimeError as e:
        out["again"] = str(e)
    hosts = attach_to_workers(workers=[gateway, other])
    procs = hosts.spawn_procs(per_host={"gpus": 2})
    echoes = procs.spawn("echoes", Echo)
    out["echo"] = list(echoes.echo.call("hi").get(timeout=TIMEOUT).values())
    out["netns"] = list(echoes.netns.call().get(timeout=TIMEOUT).values())
    out["client_netns"] = os.readlink("/proc/self/ns/net")
    for seq in range(200):  # in order, although every one of them is relayed
        echoes.record.broadcast(seq)
    out["recorded"] = list(echoes.recorded.call().get(timeout=TIMEOUT).values())
    # A port on this client's address, from the workers' hosts: they cannot reach it.
    with socket.create_server((client_ip, 0)) as server:
        port = server.getsockname()[1]
        out["dial"] = list(echoes.dial.call(client_ip, port).get(timeout=TIMEOUT).values())
    # this_host() is still this machine; its procs are reached back through the gateway.
    local = this_host().spawn_procs(per_host={"local": 1}).spawn("local", Echo)
    mine = this_proc().spawn("mine", Echo)
    out["local_netns"] = local.netns.call_one().get(timeout=TIMEOUT)
    out["local"] = local.echo.call_one("from-client").get(timeout=TIMEOUT)
    relays = procs.spawn("relays", Relay, local)
    out["to_local"] = list(relays.relay.call("through-remote").get(timeout=TIMEOUT).values())
    to_mine = procs.spawn("to_mine", Relay, mine)
    out["to_client"] = list(to_mine.relay.call("to-this-proc").get(timeout=TIMEOUT).values())
    hosts.shutdown().get(timeout=TIMEOUT)
    return out


def kill(gateway: str, other: str, client_ip: str) -> dict[str, Any]:
    danaus.actor.unhandled_fault_hook = lambda failure: None  # the failures are expected
    attach(gateway)
    hosts = attach_to_workers(workers=[gateway, other])
    procs = hosts.spawn_procs(per_host={"gpus": 1})
    holders = procs.spawn("holders", Holder)
    holders.initialized.get(timeout=TIMEOUT)
    pending = [holders.slice(hosts=h).hold.call_one() for h in (0, 1)]
    echoes = procs.spawn("echoes", Echo)
    assert list(echoes.echo.call(1).get(timeout=TIMEOUT).values()) == [1, 1]  # all up
    print("HOLDING", flush=True)
    sys.stdin.readline()  # the gateway is being killed
    out: dict[str, Any] = {"pending": []}
    for fut in pending:
        try:
            out["pending"].append(f"answered {fut.get(timeout=TIMEOUT)!r}")
        except SupervisionError as e:
            out["pending"].append(f"SupervisionError: {e}")
        except Exception as e:
            out["pending"].append(f"{type(e).__name__}: {e}")
    try:  # the worker that still runs cannot be reached either: no route is left
        out["later"] = repr(echoes.slice(hosts=1).echo.call_one(2).get(timeout=TIMEOUT))
    except SupervisionError as e:
        out["later"] = f"SupervisionError: {e}"
    except Exception as e:
        out["later"] = f"{type(e).__name__}: {e}"
    return out


def errors(address: str, *_: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    try:
        attach(address)  # nothing listens there
    except RuntimeError as e:
        out["unreachable"] = str(e)
    context()  # the failed attach left nothing bootstrapped: this starts the client
    try:
        attach(address)
    except RuntimeError as e:
        out["after_bootstrap"] = str(e)
    return out


if __name__ == "__main__":
    mode, *args = sys.argv[1:]
    result = {"relay": relay, "kill": kill, "errors": errors}[mode](*args)
    print("RESULT " + json.dumps(result), flush=True)
