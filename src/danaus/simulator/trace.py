"""Monarch's ``monarch.simulator.trace``, in part: ``TraceEvent``, a finished task as the
trace shows it. Writing workers' events as a trace is
``danaus.simulator.worker.write_trace``."""

from __future__ import annotations

from .._sim.tasks import TraceEvent

__all__ = ["TraceEvent"]
