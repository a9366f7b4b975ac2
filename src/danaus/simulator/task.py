"""Monarch's ``monarch.simulator.task``: the tasks of the task-queue simulated workers.

A ``Task`` is one command's work on a stream; it moves PENDING -> READY ->
EXECUTING -> EXECUTED (``TaskState``) as the tasks before it, its collective's
peers and the events it waits for (``EventTask``) allow. ``WorkerTaskManager``
numbers a worker's live tasks and clones them with their links. See
``danaus.simulator.worker`` and ``docs/simulator.md``.
"""

from __future__ import annotations

from .._sim.tasks import Borrow, EventTask, Task, TaskState, WorkerTaskManager

__all__ = ["Borrow", "EventTask", "Task", "TaskState", "WorkerTaskManager"]
