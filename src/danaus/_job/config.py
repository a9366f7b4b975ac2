"""``hosts_from_config``: the host mesh of the allocation this program runs in.

Inside a Slurm allocation (``$SLURM_JOB_NODELIST`` set), with a ``danaus
worker`` started on every node (``srun danaus worker --listen
tcp://0.0.0.0:PORT``), it attaches to those workers, at each node's
``NodeAddr`` as ``scontrol`` reports it (the node's name where it cannot). Elsewhere it does what
Monarch's stand-in does: it starts two local worker hosts, so that examples
written for a cluster run on a laptop.
"""

from __future__ import annotations

import atexit
import os
import re

from .. import _config as config
from .._actor.api.hosts import HostMesh
from .._actor.api.joining import attach_to_workers
from .slurm import _bracket, node_addresses
from .workers import ProcessJob

__all__ = ["expand_hostlist", "hosts_from_config"]

# Per process, not a node part: these workers last as long as the program ("ended
# when this program exits"), not the client session (node) that attached to them,
# and the at-exit hook that ends them must find them after shutdown_context() has
# ended that node.
_local_jobs: list[ProcessJob] = []


def expand_hostlist(hostlist: str) -> list[str]:
    """Slurm's compressed host list, expanded: ``"n[01-03,07],gpu5"`` -> n01 n02 n03 n07 gpu5.

    Raises ``ValueError`` for a malformed list.
    """
    hosts: list[str] = []
    for item in _split_top(hostlist):
        m = re.fullmatch(r"([^\[\]]*)\[([^\[\]]+)\]([^\[\]]*)", item)
        if m is None:
            if "[" in item or "]" in item or not item:
                raise ValueError(f"malformed Slurm host list {hostlist!r} (at {item!r})")
            hosts.append(item)
            continue
        prefix, ranges, suffix = m.groups()
        for part in ranges.split(","):
            lo, sep, hi = part.partition("-")
            if not lo.isdigit() or (sep and not hi.isdigit()):
                raise ValueError(f"malformed Slurm host list {hostlist!r} (at {part!r})")
            if not sep:
                hosts.append(f"{prefix}{lo}{suffix}")
                continue
            if int(hi) < int(lo):
                raise ValueError(f"malformed Slurm host list {hostlist!r} (range {part!r})")
            width = len(lo)
            hosts += [f"{prefix}{i:0{width}d}{suffix}" for i in range(int(lo), int(hi) + 1)]
    return hosts


def _split_top(hostlist: str) -> list[str]:
    """Split on the commas outside brackets."""
    items, depth, cur = [], 0, ""
    for c in hostlist.strip():
        if c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
        if c == "," and depth == 0:
            items.append(cur)
            cur = ""
        else:
            cur += c
    items.append(cur)
    return items


def hosts_from_config(name: str) -> HostMesh:
    """The host mesh named ``name`` (dimension ``hosts``) of where this program runs.

    In a Slurm allocation: one host per node of ``$SLURM_JOB_NODELIST``, in
    that order, attached at the node's ``NodeAddr`` (``scontrol show node``;
    its name when Slurm's commands are not there) on the setting
    ``worker_port`` (``$DANAUS_WORKER_PORT``, default 26600) with the job
    secret ``$DANAUS_SECRET``. Elsewhere: the setting
    ``local_hosts`` (2) local worker processes, ended when this program exits.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"hosts_from_config needs a mesh name, got {name!r}")
    nodelist = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST")
    if nodelist:
        port = config.get("worker_port")
        if not 0 < port < 65536:
            raise ValueError(f"the setting worker_port must be a TCP port number, got {port!r}")
        nodes = expand_hostlist(nodelist)
        addrs = node_addresses(nodelist)
        workers = [f"tcp://{_bracket(addrs.get(n, n))}:{port}" for n in nodes]
        return attach_to_workers(workers=workers, name=name)
    job = ProcessJob({"hosts": config.get("local_hosts")})
    if not _local_jobs:
        atexit.register(_kill_local)
    _local_jobs.append(job)
    mesh: HostMesh = job.state(cached_path=None).hosts
    return mesh


def _kill_local() -> None:
    for job in _local_jobs:
        job.kill()
    _local_jobs.clear()
