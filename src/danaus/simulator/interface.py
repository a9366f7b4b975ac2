"""Monarch's ``monarch.simulator.interface``: the ``Simulator`` mesh factory."""

from __future__ import annotations

from .._sim.interface import Simulator, SimulatorInterface

__all__ = ["Simulator", "SimulatorInterface"]
