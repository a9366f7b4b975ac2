"""An attacker on the rendezvous of process groups (issue 40, N1), for the tests that
run one from another uid or another network namespace.

``job_listeners`` finds every TCP port the job listens on (a process and all its
descendants: client, host agent, zygote, procs); ``attack`` runs, in a process of
its own (``prefix`` makes it another user's or another namespace's), a
``TCPStore`` client against each target that tries to join, set, read and count
the keys there, and says per target whether it got in. ``live_rendezvous``
keeps both of danaus's rendezvous stores in use meanwhile: a tensor engine that
built a process group, and an elastic mesh that formed a membership.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from danaus.elastic import ElasticReplica

ATTACK = r"""
import datetime, json, os, sys, threading, time
import torch.distributed as dist

out = {}

def one(host, port):
    try:
        s = dist.TCPStore(host, port, is_master=False, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=3))
        s.set("danaus-attack", "planted")
        got = s.get("danaus-attack")
        out[f"{host}:{port}"] = f"in: read back {got!r}, {s.num_keys()} keys"
    except Exception as e:
        out[f"{host}:{port}"] = f"kept out: {type(e).__name__}: {str(e)[:120]}"

targets = json.loads(sys.argv[1])
threads = [threading.Thread(target=one, args=tuple(t), daemon=True) for t in targets]
for t in threads:
    t.start()
deadline = time.monotonic() + 20  # one deadline for all: the targets are tried at once
for t in threads:
    t.join(max(0.0, deadline - time.monotonic()))
for host, port in targets:
    out.setdefault(f"{host}:{port}", "kept out: no answer within 20 s")
print(json.dumps(out), flush=True)
os._exit(0)  # threads stuck in a store's wait
"""


def _descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = {root}, [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _listening_inodes() -> dict[int, tuple[str, int]]:
    """Listening TCP sockets of this network namespace: inode -> (address, port)."""
    out = {}
    for name in ("tcp", "tcp6"):
        with open(f"/proc/net/{name}") as f:
            next(f)
            for line in f:
                words = line.split()
                if words[3] != "0A":  # LISTEN
                    continue
                hexaddr, hexport = words[1].rsplit(":", 1)
                if len(hexaddr) == 8:
                    addr = ".".join(str(b) for b in reversed(bytes.fromhex(hexaddr)))
                else:
                    addr = "::" if set(hexaddr) == {"0"} else "ipv6"
                out[int(words[9])] = (addr, int(hexport, 16))
    return out


def job_listeners(root: int) -> list[tuple[str, int]]:
    """Every TCP address ``root`` and its descendants listen on (this namespace)."""
    listening = _listening_inodes()
    found = set()
    for pid in _descendants(root):
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if link.startswith("socket:["):
                        inode = int(link[8:-1])
                        if inode in listening:
                            found.add(listening[inode])
    return sorted(found)


def attack(targets: list[tuple[str, int]], prefix: list[str]) -> dict[str, str]:
    """``{"host:port": "in: ..." | "kept out: ..."}``: a ``TCPStore`` client's try at
    each target, from a process started with ``prefix`` (``setpriv ...``, ``ip netns
    exec ...``)."""
    done = subprocess.run(
        [*prefix, sys.executable, "-c", ATTACK, json.dumps(targets)],
        capture_output=True,
        text=True,
        timeout=90,
        cwd="/",
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])  # type: ignore[no-any-return]


class StepReplica(ElasticReplica):
    """Sums a one over the membership: a collective on the membership's group."""

    def train_step(self, step: int) -> float:
        import torch

        t = torch.ones(1)
        self.all_reduce([t])
        return float(t)

    def commit(self, step: int) -> None:
        pass

    def state(self) -> list[Any]:
        return []


@dataclass
class Rendezvous:
    """Both rendezvous stores, in use: the engine's and the elastic coordinator's."""

    engine_store: Any
    elastic: Any


def _reduce_once(pm: Any) -> None:
    import torch

    import danaus

    with pm.activate():
        total = danaus.inspect(torch.ones(3).reduce("gpu", "sum"), gpu=0)
    assert torch.equal(total, torch.full((3,), 2.0)), total


@contextlib.contextmanager
def live_rendezvous(timeout: float) -> Iterator[Rendezvous]:
    """A tensor engine whose workers built a process group, and an elastic mesh whose
    replicas formed one, both kept alive for the block."""
    from danaus._tensor.engine import engine_for
    from danaus.actor import this_host
    from danaus.elastic import ElasticMesh

    pm = this_host().spawn_procs(per_host={"gpu": 2})
    elastic = None
    try:
        _reduce_once(pm)
        elastic = ElasticMesh(StepReplica, replicas=2, spares=0, timeout=timeout)
        world, values = elastic.step(0)
        assert world == 2 and values == [2.0, 2.0], (world, values)
        yield Rendezvous(engine_for(pm).store, elastic)
    finally:
        if elastic is not None:
            elastic.stop()
        pm.stop().get(timeout=timeout)
