"""``danaus.Simulator(hosts, gpus)``: a simulated mesh and the handle to its results."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from .._actor.api.procs import _ProcState
from .._mesh import Shape, Slice
from .._tensor import simulator as _meta_labels
from .core import Simulator as _Core
from .core import SimulatorBackendMode, SimulatorTraceMode, WorkerGroup
from .costs import CostModel, FixedCosts, MeasuredCosts
from .engine import SimEngine
from .mesh import SimulatedMesh, allow_simulated_cuda

__all__ = ["GroupReport", "SimulationReport", "Simulator", "SimulatorInterface"]


@dataclass
class GroupReport:
    """One group of ranks that behaved alike: ``ranks``; per stream, ``busy`` (seconds of
    work, not counting waits for other streams or ranks) and ``end`` (when its last task
    ends); peak GPU and host memory (bytes); the GPU memory timeline
    (``(seconds, bytes)`` after each change)."""

    ranks: list[int]
    streams: dict[str, dict[str, float]]
    peak_memory: int
    peak_host_memory: int
    memory: list[tuple[float, int]] = field(default_factory=list)


@dataclass
class SimulationReport:
    """What a simulation found: total simulated time (s), peak GPU memory (bytes) of any
    rank, and one ``GroupReport`` per group of ranks that behaved alike."""

    time: float
    peak_memory: int
    groups: list[GroupReport]

    def to_json(self) -> str:
        return json.dumps(
            {
                "time": self.time,
                "peak_memory": self.peak_memory,
                "groups": [g.__dict__ for g in self.groups],
            }
        )


class SimulatorInterface:
    """What ``danaus.Simulator(...)`` returns: ``mesh`` (the simulated mesh) and the
    results. ``step()`` ends an iteration (trace ``trace_<i>.json``); ``mesh.exit()``
    ends the simulation; ``report()`` gives times and memory per group of ranks."""

    def __init__(
        self, simulator: _Core, hosts: int, gpus: int, *, simulate_mode: SimulatorBackendMode
    ) -> None:
        n = hosts * gpus
        allow_simulated_cuda()
        self.mode = simulate_mode
        self.simulator = simulator  # of hosts * gpus ranks
        shape = Shape(["host", "gpu"], Slice.new_row_major([hosts, gpus]))
        state = _ProcState(owned=True)
        state.initialized.set_result(True)
        self._engine = SimEngine(self.simulator, shape, gpus)
        state.tensor_engine = self._engine
        self.mesh = SimulatedMesh(shape, state, self, n)
        self.iter = 0
        self.exited = False
        self._activations: list[Any] = []  # what mesh.deactivate() ends
        _meta_labels.simulating(True)

    @property
    def _dump(self) -> bool:
        return self.mode is not SimulatorBackendMode.SIMULATE_WITH_REPORT_ONLY

    def step(self) -> tuple[float, float]:
        """End an iteration: (simulated seconds so far, peak GPU memory in MB); writes
        this iteration's trace unless the mode is ``SIMULATE_WITH_REPORT_ONLY``."""
        self._engine.flush()
        out = self.simulator.step(self.iter, dump_trace=self._dump)
        self.iter += 1
        return out

    def _exit(self) -> None:
        if self.exited:
            return
        self._engine.exit()  # Monarch's RequestStatus and Exit, in the controller's trace
        self.simulator.exit(self.iter, dump_trace=self._dump)
        self.exited = True
        _meta_labels.simulating(False)

    def report(self) -> SimulationReport:
        """Times and memory so far, per group of ranks that behaved alike."""
        self._engine.flush()
        sim = self.simulator
        groups = []
        end = 0
        for g in sorted(sim.workers, key=lambda g: int(g.workers.min())):
            groups.append(_group_report(sim, g))
            for s in g.streams.values():
                end = max(end, s.free)
        peak = max((g.peak_memory for g in groups), default=0)
        return SimulationReport(end / 1e9, peak, groups)

    def upload(self) -> None:
        raise NotImplementedError(
            "upload() sends the trace to Meta's internal trace store; open the trace file "
            f"({self.simulator.trace_path}) in https://ui.perfetto.dev instead"
        )

    def display(self) -> None:
        raise NotImplementedError(
            "display() opens Meta's notebook viewer; open the trace file "
            f"({self.simulator.trace_path}) in https://ui.perfetto.dev instead"
        )

    def export_ir(self, ir_path: str) -> None:
        raise NotImplementedError(
            "danaus's simulator builds no IR graph (Simulator(build_ir=True) is not supported); "
            "use report() or the trace file"
        )


def _group_report(sim: _Core, g: WorkerGroup) -> GroupReport:
    streams = {}
    for name, s in g.streams.items():
        streams[name] = {"busy": s.busy / 1e9, "end": s.free / 1e9}
    mem = [(ts / 1e9, b) for ts, b in sim.memory_timeline(g, "cuda")]
    return GroupReport([int(r) for r in g.workers], streams, g.peak["cuda"], g.peak["cpu"], mem)


def Simulator(
    hosts: int,
    gpus: int,
    *,
    simulate_mode: str | SimulatorBackendMode = SimulatorBackendMode.SIMULATE,
    trace_mode: str | SimulatorTraceMode = SimulatorTraceMode.STREAM_ONLY,
    upload_trace: bool = False,
    trace_path: str = "trace.json",
    command_history_path: str = "command_history.pkl",
    group_workers: bool = False,
    build_ir: bool = False,
    costs: CostModel | str | None = None,
    cost_cache: str | os.PathLike[str] | None = None,
) -> SimulatorInterface:
    """A simulated mesh of ``hosts`` x ``gpus`` ranks (dimensions ``host``, ``gpu``).

    Run a tensor program under ``sim.mesh.activate()`` as on real procs: no
    processes start and no device is needed; each rank's streams and memory
    are simulated. ``sim.mesh.exit()`` writes the Chrome/Perfetto trace to
    ``trace_path`` with ``_<iteration>`` before the extension.

    Monarch's arguments: ``simulate_mode`` and ``trace_mode`` (names or enum
    members), ``group_workers`` (simulate ranks that behave alike once).
    ``command_history_path`` is accepted and unused (``COMMAND_HISTORY``
    modes raise ``NotImplementedError``), ``build_ir=True`` raises it too.
    danaus's: ``costs`` is ``"fixed"`` (Monarch's guesses, the default),
    ``"measured"`` (time each op here, cached in ``cost_cache``) or a
    ``CostModel``.
    """
    for what, v in (("hosts", hosts), ("gpus", gpus)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"Simulator: {what} must be an int >= 1, got {v!r}")
    mode: SimulatorBackendMode = (
        _enum(SimulatorBackendMode, simulate_mode, "simulate_mode")
        if isinstance(simulate_mode, str)
        else simulate_mode
    )
    tmode: SimulatorTraceMode = (
        _enum(SimulatorTraceMode, trace_mode, "trace_mode")
        if isinstance(trace_mode, str)
        else trace_mode
    )
    if mode.command_history_enabled:
        raise NotImplementedError(
            f"simulate_mode={mode.name}: danaus records no command history; use "
            "SIMULATE or SIMULATE_WITH_REPORT_ONLY"
        )
    if build_ir:
        raise NotImplementedError("Simulator(build_ir=True): danaus's simulator builds no IR")
    if costs is None or costs == "fixed":
        model: CostModel = FixedCosts()
    elif costs == "measured":
        model = MeasuredCosts(cost_cache)
    elif isinstance(costs, CostModel):
        model = costs
    else:
        raise ValueError(
            f"Simulator: costs must be 'fixed', 'measured' or a CostModel, got {costs!r}"
        )
    core = _Core(
        world_size=hosts * gpus,
        trace_mode=tmode,
        trace_path=trace_path,
        group_workers=group_workers,
        costs=model,
        upload_trace=upload_trace,
    )
    return SimulatorInterface(core, hosts, gpus, simulate_mode=mode)


def _enum(cls: Any, name: str, what: str) -> Any:
    try:
        return cls[name.upper()]
    except KeyError:
        raise ValueError(
            f"Simulator: {what}={name!r} is not one of {[m.name for m in cls]}"
        ) from None
