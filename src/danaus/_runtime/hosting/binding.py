"""CPU and NUMA binding of a proc (``spawn_procs(proc_bind=[...])``, as Monarch's).

Each proc may get a dict of binding keys, applied at the very start of the
proc, before it starts any thread (so every thread it starts inherits them):

- ``cpus`` / ``physcpubind``: the CPUs it may run on (``"0-3,8"``), as
  ``taskset -c`` / ``numactl --physcpubind``;
- ``cpunodebind``: the CPUs of these NUMA nodes (``"0"``, ``"0,1"``), as
  ``numactl --cpunodebind`` (with ``cpus`` too, the CPUs in both);
- ``membind``: allocate memory only on these NUMA nodes, as
  ``numactl --membind`` (``set_mempolicy(MPOL_BIND)``).

Linux only (``sched_setaffinity``, ``/sys/devices/system/node``).
"""

from __future__ import annotations

import ctypes
import os
import platform
from collections.abc import Mapping

__all__ = ["KEYS", "apply", "check", "cpulist"]

KEYS = ("cpus", "physcpubind", "cpunodebind", "membind")
_MPOL_BIND = 2
_SET_MEMPOLICY = {"x86_64": 238, "aarch64": 237}  # syscall numbers


def cpulist(text: str) -> set[int]:
    """The numbers of a Linux CPU list (``"0-3,8,10-11"``); ``ValueError`` if malformed."""
    out: set[int] = set()
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"not a CPU or node list: {text!r} (expected like '0-3,8')")
        first, last = int(lo), int(hi) if sep else int(lo)
        if last < first:
            raise ValueError(f"not a CPU or node list: {text!r} ({part!r} runs backwards)")
        out.update(range(first, last + 1))
    if not out:
        raise ValueError(f"not a CPU or node list: {text!r} (empty)")
    return out


def check(proc_bind: object, procs_per_host: int) -> list[dict[str, str]] | None:
    """``proc_bind`` checked on the client (``ValueError``/``TypeError`` naming what is
    wrong); one dict per proc of a host, in the order of ``per_host`` (row major)."""
    if proc_bind is None:
        return None
    if not isinstance(proc_bind, (list, tuple)):
        raise TypeError(f"proc_bind must be a list of dicts, one per proc, got {proc_bind!r}")
    if len(proc_bind) != procs_per_host:
        raise ValueError(
            f"proc_bind length ({len(proc_bind)}) must equal procs_per_host ({procs_per_host})"
        )
    out = []
    for i, bind in enumerate(proc_bind):
        if not isinstance(bind, Mapping):
            raise TypeError(f"proc_bind[{i}] must be a dict like {{'cpus': '0-3'}}, got {bind!r}")
        unknown = sorted(set(bind) - set(KEYS))
        if unknown:
            raise ValueError(f"proc_bind[{i}] has unknown keys {unknown}; valid: {list(KEYS)}")
        for value in bind.values():
            cpulist(value)  # malformed lists fail here, not in the proc
        out.append({str(k): str(v) for k, v in bind.items()})
    return out


def _node_cpus(nodes: set[int]) -> set[int]:
    cpus: set[int] = set()
    for node in sorted(nodes):
        path = f"/sys/devices/system/node/node{node}/cpulist"
        try:
            with open(path) as f:
                cpus |= cpulist(f.read())
        except FileNotFoundError:
            raise ValueError(f"NUMA node {node} does not exist on this host ({path})") from None
    return cpus


def apply(bind: Mapping[str, str] | None) -> None:
    """Bind this process as ``bind`` says (``OSError``/``ValueError`` if it cannot)."""
    if not bind:
        return
    cpus: set[int] | None = None
    for key in ("cpus", "physcpubind"):
        if key in bind:
            wanted = cpulist(bind[key])
            cpus = wanted if cpus is None else cpus & wanted
    if "cpunodebind" in bind:
        on_nodes = _node_cpus(cpulist(bind["cpunodebind"]))
        cpus = on_nodes if cpus is None else cpus & on_nodes
    if cpus is not None:
        if not cpus:
            raise ValueError(f"proc_bind {dict(bind)} leaves no CPU to run on")
        os.sched_setaffinity(0, cpus)
    if "membind" in bind:
        _membind(cpulist(bind["membind"]))


def _membind(nodes: set[int]) -> None:
    _node_cpus(nodes)  # each node exists
    number = _SET_MEMPOLICY.get(platform.machine())
    if number is None:
        raise OSError(f"membind is not supported on {platform.machine()}")
    maxnode = max(nodes) + 2
    words = (maxnode + 63) // 64
    mask = (ctypes.c_ulong * words)()
    for n in nodes:
        mask[n // 64] |= 1 << (n % 64)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(number, _MPOL_BIND, mask, ctypes.c_ulong(maxnode)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"set_mempolicy(MPOL_BIND, nodes {sorted(nodes)}): {os.strerror(err)}")
