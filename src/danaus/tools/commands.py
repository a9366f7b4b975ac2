"""``danaus.tools.commands``: Monarch's ``monarch.tools.commands`` on danaus's jobs.

A server is a job saved in a context (``danaus context``): ``create(Config(job=...),
name)`` applies and saves it, its handle is ``danaus:///NAME``; ``info``,
``server_ready``, ``get_or_create`` and ``kill`` take that handle. ``apply_job``,
``exec_on_job`` and ``shell_on_job`` are the ``danaus apply``/``exec``/``shell``
commands. See ``docs/jobs.md`` and, for what differs from Monarch (no TorchX),
``docs/monarch-differences.md``.

Example:

    from danaus.tools.commands import exec_on_job

    rc = exec_on_job(["hostname"], run_all=True)
"""

from __future__ import annotations

from .._job import commands as _commands
from .._job.commands import DEFAULT_JOB_PATH as DEFAULT_JOB_PATH
from .._job.commands import MONARCH_DIR as MONARCH_DIR
from .._job.commands import apply_job as apply_job
from .._job.commands import context_create as context_create
from .._job.commands import context_ls as context_ls
from .._job.commands import context_rm as context_rm
from .._job.commands import context_use as context_use
from .._job.commands import create as create
from .._job.commands import exec_on_job as exec_on_job
from .._job.commands import get_or_create as get_or_create
from .._job.commands import info as info
from .._job.commands import kill as kill
from .._job.commands import kill_and_confirm as kill_and_confirm
from .._job.commands import load_current_job as load_current_job
from .._job.commands import server_ready as server_ready
from .._job.commands import shell_on_job as shell_on_job

__all__ = _commands.__all__  # Monarch's names, each imported above for the reference
