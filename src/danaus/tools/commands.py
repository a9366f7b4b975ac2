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
from .._job.commands import *  # noqa: F403  (the names of its __all__)

__all__ = _commands.__all__
