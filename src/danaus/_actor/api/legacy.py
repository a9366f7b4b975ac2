"""Monarch's older entry points, kept so older programs run: they warn and spawn real procs.

``proc_mesh``, ``local_proc_mesh`` and ``sim_proc_mesh`` predate
``this_host().spawn_procs(per_host=...)``; each warns with
``DeprecationWarning`` and returns what that call returns.
"""

from __future__ import annotations

import glob
import os
import re
import warnings
from collections.abc import Callable
from typing import Any

from .hosts import this_host
from .procs import ProcMesh

__all__ = ["local_proc_mesh", "proc_mesh", "sim_proc_mesh"]


def _local_device_count() -> int:
    """GPUs this host shows (``CUDA_VISIBLE_DEVICES``, else ``/dev/nvidiaN``), at least 1.

    Counted without importing torch, which would cost seconds.
    """
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return max(1, len([d for d in visible.split(",") if d.strip()]))
    devices = [d for d in glob.glob("/dev/nvidia*") if re.fullmatch(r"/dev/nvidia\d+", d)]
    return max(1, len(devices))


def _deprecated(old: str, new: str) -> None:
    warnings.warn(
        f"{old} is deprecated (as in Monarch); use {new} instead", DeprecationWarning, stacklevel=3
    )


def _check_count(what: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{what} must be a positive int, got {value!r}")


def proc_mesh(
    *,
    gpus: int | None = None,
    hosts: int = 1,
    env: dict[str, str] | None = None,
    setup: Callable[[], Any] | None = None,
) -> ProcMesh:
    """Deprecated: ``this_host().spawn_procs(per_host={"hosts": hosts, "gpus": gpus})``.

    ``gpus`` defaults to the GPUs this host shows (at least 1); ``setup`` runs in
    every proc first. Warns ``DeprecationWarning``; ``ValueError`` for a
    non-empty ``env`` (as Monarch). Never blocks.
    """
    _deprecated(
        f"proc_mesh(hosts={hosts!r}, gpus={gpus!r})",
        f"this_host().spawn_procs(per_host={{'hosts': {hosts!r}, 'gpus': {gpus!r}}})",
    )
    if env:
        raise ValueError(
            f"proc_mesh(env={env!r}) is not supported (nor in Monarch); set the variables in "
            "a bootstrap function: this_host().spawn_procs(per_host=..., bootstrap=fn)"
        )
    return _spawn({"hosts": hosts, "gpus": gpus}, setup)


def local_proc_mesh(*, gpus: int | None = None, hosts: int = 1) -> ProcMesh:
    """Deprecated: like [`proc_mesh()`][danaus.actor.proc_mesh], on this host. Warns
    ``DeprecationWarning``.

    Monarch ran these procs in one process ("fake in-process host"); danaus
    spawns real processes, which behave the same from the program's side.
    """
    _deprecated(
        f"local_proc_mesh(hosts={hosts!r}, gpus={gpus!r})",
        "this_host().spawn_procs(per_host=...) (or this_proc() for the client's own process)",
    )
    return _spawn({"hosts": hosts, "gpus": gpus}, None)


def sim_proc_mesh(
    *,
    gpus: int = 1,
    hosts: int = 1,
    racks: int = 1,
    zones: int = 1,
    dcs: int = 1,
    regions: int = 1,
) -> ProcMesh:
    """Deprecated: a mesh with dimensions regions, dcs, zones, racks, hosts, gpus.

    Monarch simulated these procs (and has since removed the function); danaus
    spawns real local processes, one per point. Warns ``DeprecationWarning``.
    """
    _deprecated(
        "sim_proc_mesh(...) (Monarch has removed its simulator)",
        "this_host().spawn_procs(per_host={'regions': ..., ..., 'gpus': ...})",
    )
    sizes = {"regions": regions, "dcs": dcs, "zones": zones, "racks": racks, "hosts": hosts}
    return _spawn({**sizes, "gpus": gpus}, None)


def _spawn(per_host: dict[str, int | None], setup: Callable[[], Any] | None) -> ProcMesh:
    if per_host.get("gpus") in (None, 0):  # Monarch: "gpus if gpus else local count"
        per_host["gpus"] = _local_device_count()
    for label, size in per_host.items():
        _check_count(label, size)
    sizes = {k: v for k, v in per_host.items() if v is not None}
    return this_host().spawn_procs(per_host=sizes, bootstrap=setup)
