"""``danaus.tools.config.workspace``: Monarch's module of ``Workspace``."""

from __future__ import annotations

from ..._actor.api.code_sync import Workspace
from .environment import ACTIVE_CONDA_ENV as ACTIVE_CONDA_ENV

__all__ = ["ACTIVE_CONDA_ENV", "Workspace"]
