"""``danaus.job``: how hosts are obtained — Monarch's ``monarch.job``.

Example::

    from danaus.job import ProcessJob

    job = ProcessJob({"trainers": 2})
    procs = job.state().trainers.spawn_procs(per_host={"gpus": 2})
"""

from __future__ import annotations

from ._job.config import hosts_from_config as hosts_from_config
from ._job.jobs import JobState as JobState
from ._job.jobs import JobTrait as JobTrait
from ._job.jobs import LocalJob as LocalJob
from ._job.jobs import ProcessJob as ProcessJob
from ._job.jobs import SSHJob as SSHJob
from ._job.jobs import StartedWorker as StartedWorker
from ._job.load import job_load as job_load
from ._job.load import job_loads as job_loads
from ._job.slurm import SlurmError as SlurmError
from ._job.slurm import SlurmJob as SlurmJob
from ._job.telemetry import TelemetryConfig as TelemetryConfig

__all__ = [
    "JobState",
    "JobTrait",
    "LocalJob",
    "ProcessJob",
    "SSHJob",
    "SlurmError",
    "SlurmJob",
    "StartedWorker",
    "TelemetryConfig",
    "hosts_from_config",
    "job_load",
    "job_loads",
]

for _name in __all__:
    if _name != "hosts_from_config":  # danaus.actor's, re-exported as in monarch.job
        globals()[_name].__module__ = __name__
del _name
