"""Two hosts: a client attaches to two ``danaus worker`` hosts and runs actors on both.

Run it as root on Linux with iproute2 (``ip``); it takes a few seconds::

    sudo python examples/two_hosts.py

It builds two "hosts" on this machine, network namespaces joined to a bridge
on a 10.231.R.0/24 that no address or route here uses, starts ``danaus
worker`` in each, attaches to them, spawns two procs per host, calls them,
prints where each one runs (its network namespace and TCP address), then
shuts everything down and removes the namespaces. Nothing leaves the machine.

Or attach to workers you started yourself, on other machines or this one::

    export DANAUS_SECRET=$(python -c 'import secrets; print(secrets.token_hex(32))')
    python -m danaus worker --listen tcp://0.0.0.0:26600       # on each host, same secret
    python examples/two_hosts.py --workers tcp://HOST_A:26600 tcp://HOST_B:26600
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import os
import random
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from danaus.actor import Actor, attach_to_workers, context, endpoint

TIMEOUT = 30.0


class Where(Actor):
    """Says where it runs, and can call another mesh from there."""

    @endpoint
    def where(self) -> str:
        netns = os.readlink("/proc/self/ns/net")
        tcp = [e for e in context().actor_instance.actor_id.addr.split(";") if e.startswith("tcp")]
        return f"pid {os.getpid()}, {netns}, reachable at {tcp[0] if tcp else '?'}"

    @endpoint
    def ask(self, other: Where) -> list[str]:  # a mesh of Where actors, as spawn types it
        return list(other.where.call().get(timeout=TIMEOUT).values())


def run(workers: list[str], secret: str | None) -> None:
    hosts = attach_to_workers(workers=workers, secret=secret)
    procs = hosts.spawn_procs(per_host={"gpus": 2})
    print(f"attached {hosts}, spawned {procs}")
    actors = procs.spawn("where", Where)
    for point, answer in actors.where.call().get(timeout=TIMEOUT).items():
        print(f"  {point}: {answer}")
    print("host 0, proc 1 asks every actor on host 1 where it is:")
    for answer in actors.slice(hosts=0, gpus=1).ask.call_one(actors.slice(hosts=1)).get(TIMEOUT):
        print(f"  {answer}")
    hosts.shutdown().get(timeout=TIMEOUT)
    print("shut down")


# -- two hosts on this machine (network namespaces) --------------------------------


def _ip(*args: str, check: bool = True) -> str:
    out = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and out.returncode != 0:
        raise RuntimeError(f"`ip {' '.join(args)}` failed: {out.stderr.strip()}")
    return out.stdout


def _free_subnet() -> ipaddress.IPv4Network:
    used = [
        ipaddress.ip_interface(w[w.index("inet") + 1]).network
        for w in (line.split() for line in _ip("-4", "-o", "addr").splitlines())
    ]
    for line in _ip("-4", "route", "show", "table", "all").splitlines():
        with contextlib.suppress(ValueError, IndexError):
            used.append(ipaddress.ip_network(line.split()[0], strict=False))
    candidates = [ipaddress.ip_network(f"10.231.{r}.0/24") for r in range(256)]
    return random.choice([n for n in candidates if not any(n.overlaps(u) for u in used)])


@contextlib.contextmanager
def local_workers(n: int, secret: str) -> Iterator[list[str]]:
    """Start ``n`` workers, each in a network namespace of its own; yields their addresses."""
    tag, subnet = secrets.token_hex(3), _free_subnet()
    bridge, made, started = f"dn{tag}b", [], []
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = {
        **os.environ,
        "DANAUS_SECRET": secret,
        "PYTHONPATH": os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")])),
    }
    try:
        _ip("link", "add", bridge, "type", "bridge")
        _ip("addr", "add", f"{subnet.network_address + 1}/24", "dev", bridge)
        _ip("link", "set", bridge, "up")
        addresses = []
        for k in range(n):
            ns, veth, peer = f"dn-{tag}-{k}", f"dn{tag}v{k}", f"dn{tag}p{k}"
            ip = subnet.network_address + 10 + k
            _ip("netns", "add", ns)
            made.append(ns)
            _ip("link", "add", veth, "type", "veth", "peer", "name", peer)
            _ip("link", "set", peer, "netns", ns)
            _ip("link", "set", veth, "master", bridge)
            _ip("link", "set", veth, "up")
            _ip("-n", ns, "addr", "add", f"{ip}/24", "dev", peer)
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "link", "set", peer, "up")
            w = subprocess.Popen(
                [
                    "ip",
                    "netns",
                    "exec",
                    ns,
                    sys.executable,
                    "-m",
                    "danaus",
                    "worker",
                    "--listen",
                    f"tcp://{ip}:0",
                ],
                env=env,
                stdout=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
            started.append(w)
            assert w.stdout is not None
            line = w.stdout.readline()  # bounded: a worker that fails to start exits
            if not line.startswith("danaus worker listening on "):
                raise RuntimeError(f"the worker in {ns} did not start (said {line!r})")
            addresses.append(line.split()[-1])
            print(f"worker in netns {ns} listening on {addresses[-1]}")
        yield addresses
    finally:
        for w in started:
            if w.poll() is None:
                w.kill()
            w.wait()
        for k, ns in enumerate(made):
            _ip("link", "del", f"dn{tag}v{k}", check=False)
            _ip("netns", "del", ns, check=False)
        _ip("link", "del", bridge, check=False)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--workers",
        nargs=2,
        metavar="tcp://HOST:PORT",
        help="attach to these running workers (secret: $DANAUS_SECRET)",
    )
    args = p.parse_args()
    if args.workers:
        run(args.workers, secret=None)
        return
    if os.geteuid() != 0:
        sys.exit("creating network namespaces needs root; or pass --workers (see --help)")
    secret = secrets.token_hex(32)
    with local_workers(2, secret) as workers:
        run(workers, secret)


if __name__ == "__main__":
    main()
