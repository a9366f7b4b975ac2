"""Monarch's ``monarch.simulator.communication_model``: what collectives and copies cost."""

from __future__ import annotations

from .._sim import comm as _comm
from .._sim.comm import *  # noqa: F403  (the names of its __all__)

__all__ = _comm.__all__
