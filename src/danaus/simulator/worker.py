"""Monarch's ``monarch.simulator.worker``: simulated workers with task queues.

A ``Worker`` has ``Stream``s of ``danaus.simulator.task.Task``; ``run_until_idle``
moves every worker's tasks along until none can move; ``WorkerGroup`` stands for
ranks that received the same commands and ``split``s; ``write_trace`` writes
workers as a Chrome/Perfetto trace. This is Monarch's model of the workers, for
programs that drive it directly; ``danaus.Simulator`` (``docs/simulator.md``)
simulates a tensor program without it.
"""

from __future__ import annotations

from .._sim.workers import Stream, Worker, WorkerGroup, run_until_idle, write_trace

__all__ = ["Stream", "Worker", "WorkerGroup", "run_until_idle", "write_trace"]
