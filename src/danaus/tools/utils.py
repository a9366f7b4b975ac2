"""``danaus.tools.utils``: Monarch's ``MONARCH_HOME`` and ``conda`` helpers.

``MONARCH_HOME(*subdirs)`` is danaus's per-user directory, ``~/.danaus`` (or
``$DANAUS_HOME``), created mode 700 when missing.
"""

from __future__ import annotations

import os

from .._job.servers import home as MONARCH_HOME

__all__ = ["MONARCH_HOME", "conda"]


class conda:
    """The active conda environment, if any."""

    @staticmethod
    def active_env_dir() -> str | None:
        return os.environ.get("CONDA_PREFIX")

    @staticmethod
    def active_env_name() -> str | None:
        env_dir = conda.active_env_dir()
        return os.path.basename(env_dir) if env_dir else None
