"""``danaus.simulator``: Monarch's ``monarch.simulator``, a tensor engine without devices.

``danaus.Simulator(hosts, gpus)`` gives a mesh (``.mesh``) that runs a
tensor program's command stream on simulated workers: per rank and per
stream, when each op runs and how much memory is in use, with collectives
synchronising the streams they join, written as a Chrome/Perfetto trace.
Op costs are Monarch's fixed guesses by default, or measured on this
machine and cached (``costs="measured"``); collectives and copies follow a
communication model (``NetworkConfig``: ring and tree all-reduce, a
bandwidth and a latency per link class). With ``group_workers=True`` ranks
that receive the same commands are simulated once. Monarch's task-queue
model of the workers is in ``danaus.simulator.task``, ``tensor`` and ``worker``.
Needs torch; see ``docs/simulator.md``.
"""

from __future__ import annotations

from .._sim.comm import NetworkConfig
from .._sim.core import SimulatorBackendMode, SimulatorTraceMode
from .._sim.costs import CostModel, FixedCosts, MeasuredCosts
from .._sim.interface import SimulationReport, Simulator, SimulatorInterface
from .._tensor.simulator import set_meta

__all__ = [
    "CostModel",
    "FixedCosts",
    "MeasuredCosts",
    "NetworkConfig",
    "SimulationReport",
    "Simulator",
    "SimulatorBackendMode",
    "SimulatorInterface",
    "SimulatorTraceMode",
    "set_meta",
]
