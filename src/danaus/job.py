"""``danaus.job``: how hosts are obtained — Monarch's ``monarch.job``.

Example:

    from danaus.job import ProcessJob

    job = ProcessJob({"trainers": 2})
    procs = job.state().trainers.spawn_procs(per_host={"gpus": 2})
"""

from __future__ import annotations

from ._job.config import hosts_from_config as hosts_from_config
from ._job.current import DEFAULT_JOB_PATH as DEFAULT_JOB_PATH
from ._job.current import load_current_job as load_current_job
from ._job.current import set_current_job as set_current_job
from ._job.execute import exec_command as exec_command
from ._job.jobs import JobState as JobState
from ._job.jobs import JobTrait as JobTrait
from ._job.jobs import LocalJob as LocalJob
from ._job.load import job_load as job_load
from ._job.load import job_loads as job_loads
from ._job.port_forward import PortForwarder as PortForwarder
from ._job.shell import shell as shell
from ._job.slurm import SlurmError as SlurmError
from ._job.slurm import SlurmJob as SlurmJob
from ._job.telemetry import MeshAdminConfig as MeshAdminConfig
from ._job.telemetry import TelemetryConfig as TelemetryConfig
from ._job.workers import ProcessJob as ProcessJob
from ._job.workers import SSHJob as SSHJob
from ._job.workers import StartedWorker as StartedWorker

__all__ = [
    "DEFAULT_JOB_PATH",
    "JobState",
    "JobTrait",
    "LocalJob",
    "MeshAdminConfig",
    "PortForwarder",
    "ProcessJob",
    "SSHJob",
    "SlurmError",
    "SlurmJob",
    "StartedWorker",
    "TelemetryConfig",
    "exec_command",
    "hosts_from_config",
    "job_load",
    "job_loads",
    "load_current_job",
    "set_current_job",
    "shell",
]

for _name in __all__:
    if _name not in ("hosts_from_config", "DEFAULT_JOB_PATH"):  # hosts_from_config: danaus.actor's
        globals()[_name].__module__ = __name__
del _name
