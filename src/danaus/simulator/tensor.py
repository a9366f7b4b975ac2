"""Monarch's ``monarch.simulator.tensor``: tensors and memory of the task-queue workers.

``FakeTensorTracker`` (the fake tensor of each id, shared), ``WorkerStorageTracker``
(a worker's storages and their addresses), ``StreamMemoryTracker`` (a stream's
memory timeline) and ``TensorManager`` (who still uses each tensor of a stream).
Monarch's ``DTensorRef`` (its controller's tensor handles) is not provided.
See ``danaus.simulator.worker`` and ``docs/simulator.md``.
"""

from __future__ import annotations

from .._sim.tensors import (
    FakeTensorTracker,
    MemoryEvent,
    StorageEvent,
    StreamMemoryTracker,
    TensorManager,
    WorkerStorageTracker,
)

__all__ = [
    "FakeTensorTracker",
    "MemoryEvent",
    "StorageEvent",
    "StreamMemoryTracker",
    "TensorManager",
    "WorkerStorageTracker",
]
