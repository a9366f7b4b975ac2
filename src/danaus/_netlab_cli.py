"""``scripts/netlab``: bring a lab of hosts up or down, list the labs, or run a command
against a lab with a worker per host (``python -m danaus._netlab_cli``)."""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from ._netlab import DATACENTER, TC, Link, Network, _run, ip, lab_bridges, remove_lab
from ._netlab_workers import lab


def _link_from(args: argparse.Namespace) -> Link:
    return Link(delay_us=args.delay_us, rate=args.rate, loss_pct=args.loss)


def _status() -> str:
    bridges = lab_bridges()
    if not bridges:
        return "no lab is up"
    names = [e.split()[0] for e in ip("netns", "list").stdout.splitlines() if e.strip()]
    lines = []
    for tag, pid in bridges:
        owner = "scripts/netlab up" if pid == 0 else f"pid {pid}"
        alive = pid == 0 or os.path.exists(f"/proc/{pid}")
        gw = ip("-4", "-o", "addr", "show", "dev", f"dn{tag}b").stdout.split()
        addr = gw[gw.index("inet") + 1] if "inet" in gw else "?"
        dead = "" if alive else " (dead)"
        lines.append(f"lab {tag}: bridge dn{tag}b {addr}, owner {owner}{dead}")
        for ns in sorted(n for n in names if n.startswith(f"dn-{tag}-")):
            k = ns.rsplit("-", 1)[1]
            words = ip("-n", ns, "-4", "-o", "addr", "show", "dev", f"dn{tag}p{k}", check=False)
            w = words.stdout.split()
            qd = _run([TC, "qdisc", "show", "dev", f"dn{tag}v{k}"], check=False).stdout.strip()
            lines.append(f"  {ns}: {w[w.index('inet') + 1] if 'inet' in w else '?'}  {qd}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/netlab",
        description="Hosts as network namespaces on this machine (needs root).",
    )
    sub = parser.add_subparsers(dest="cmd", required=True)

    def shaped(p: argparse.ArgumentParser) -> None:
        p.add_argument("n", type=int, help="how many hosts")
        p.add_argument("--delay-us", type=float, default=DATACENTER.delay_us, help="one way")
        p.add_argument("--rate", default=DATACENTER.rate, help="tc rate, e.g. 10gbit")
        p.add_argument("--loss", type=float, default=0.0, help="percent, each direction")

    shaped(sub.add_parser("up", help="bring N hosts up and leave them (until `down`)"))
    sub.add_parser("down", help="remove the labs `up` made, and those of dead owners")
    sub.add_parser("status", help="list the labs on this machine")
    run = sub.add_parser(
        "run",
        help="bring N hosts up with a worker each, run CMD, tear down",
        description="CMD gets DANAUS_NETLAB_WORKERS (comma-separated worker addresses), "
        "DANAUS_SECRET, DANAUS_NETLAB_HOSTS (host addresses) and DANAUS_NETLAB_TAG.",
    )
    shaped(run)
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    args = parser.parse_args(argv)

    if args.cmd == "status":
        print(_status())
        return 0
    if args.cmd == "down":
        for tag, pid in lab_bridges():
            if pid == 0 or not os.path.exists(f"/proc/{pid}"):
                remove_lab(tag)
                print(f"removed lab {tag}")
        return 0
    link = _link_from(args)
    if args.cmd == "up":
        net = Network.make(link, owner_pid=0)
        try:
            for _ in range(args.n):
                net.add_host()
        except BaseException:
            net.destroy()
            raise
        print(f"lab {net.tag} up: client {net.gateway}, hosts", " ".join(h.ip for h in net.hosts))
        return 0
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        parser.error("run needs a command after --")
    secret = secrets.token_hex(32)

    def terminated(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)  # through the teardown below

    signal.signal(signal.SIGTERM, terminated)
    signal.signal(signal.SIGINT, terminated)
    with lab(args.n, link, secret=secret) as (net, workers):
        env = dict(os.environ)
        env.update(
            DANAUS_SECRET=secret,
            DANAUS_NETLAB_WORKERS=",".join(w.address for w in workers),
            DANAUS_NETLAB_HOSTS=",".join(h.ip for h in net.hosts),
            DANAUS_NETLAB_TAG=net.tag,
        )
        print(
            f"netlab {net.tag}: {args.n} hosts, workers {env['DANAUS_NETLAB_WORKERS']}",
            file=sys.stderr,
            flush=True,
        )
        proc = subprocess.Popen(command, env=env)
        try:
            return proc.wait()
        finally:  # stopped by a signal: CMD ends before its hosts do
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


if __name__ == "__main__":
    sys.exit(main())
