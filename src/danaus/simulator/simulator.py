"""Monarch's ``monarch.simulator.simulator``: the simulated workers (``Simulator``) and
the modes. ``Simulator`` here is the low-level class (``world_size=...``); the mesh
factory is ``danaus.Simulator``."""

from __future__ import annotations

from .._sim.core import Simulator, SimulatorBackendMode, SimulatorTraceMode, WorkerGroup
from .._sim.interface import SimulatorInterface

__all__ = [
    "Simulator",
    "SimulatorBackendMode",
    "SimulatorInterface",
    "SimulatorTraceMode",
    "WorkerGroup",
]
