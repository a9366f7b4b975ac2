"""``danaus.tools.config.defaults``: Monarch's TorchX defaults, on danaus's jobs.

Monarch maps scheduler names to TorchX schedulers; danaus's "schedulers" are its
job classes, which ``scheduler_factories()`` names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...job import LocalJob, ProcessJob, SlurmJob, SSHJob

__all__ = ["component_fn", "scheduler_factories"]


def scheduler_factories() -> dict[str, Callable[..., Any]]:
    """The job classes a ``Config.scheduler`` may name, by name. ``local_cwd`` (TorchX's
    scheduler of local processes, Monarch's default) is ``ProcessJob``."""
    return {
        "local": LocalJob,
        "local_cwd": ProcessJob,
        "process": ProcessJob,
        "ssh": SSHJob,
        "slurm": SlurmJob,
    }


def component_fn(scheduler: str) -> Callable[..., Any]:
    """The job class for ``scheduler`` (``"slurm"`` -> ``SlurmJob``): call it with the
    job's meshes and put the job in ``Config(job=...)``. ``ValueError`` for an unknown one."""
    factories = scheduler_factories()
    if scheduler not in factories:
        raise ValueError(f"unknown scheduler {scheduler!r}; danaus has {sorted(factories)}")
    return factories[scheduler]
