"""Task-queue workers: Monarch's ``monarch.simulator.worker``.

A ``Worker`` has streams; a ``Stream`` runs its queued ``tasks.Task`` in
order, each depending on the one before it. A step of the simulation asks
every worker to move its streams' head tasks along (``maybe_set_ready``,
``maybe_execute``, ``maybe_finish``) until nothing moves (``run_until_idle``):
a collective finishes only when its peers on the other workers have started,
and a borrow's wait only when the other stream reached the recorded task.
Finishing a task releases the tensors it used (``tensors.TensorManager``),
which frees the ones the controller already deleted; each finished task is a
``TraceEvent`` of its stream, each command the worker received one of its
CPU thread (a kernel launch long).

``WorkerGroup`` is a worker standing for several ranks that received the
same commands; ``split`` gives some of them a copy that goes on on its own.
``write_trace`` writes workers' events as the Chrome/Perfetto trace danaus's
simulator writes (``core``).
"""

from __future__ import annotations

import copy
import json
import os
import traceback as _tb
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

import numpy as np

from .._tensor.simulator import meta_stack
from .core import Event, _dump_thread, _meta, compress_workers_range
from .tasks import Borrow, EventTask, Task, TraceEvent, WorkerTaskManager
from .tensors import FakeTensorTracker, StreamMemoryTracker, TensorManager, WorkerStorageTracker

__all__ = ["Stream", "Worker", "WorkerGroup", "run_until_idle", "write_trace"]

KERNEL_LAUNCH_NS = 500  # Monarch's guess (RuntimeEstimator's default too)


class Stream:
    """One stream of a worker: its queue of tasks, its clock (``now``: when its last task
    ended), its finished tasks (``events``), and the tensors made on it with their
    memory (``tensors``, ``memory``). ``cpu_tensors`` are the worker's, shared by its
    streams."""

    def __init__(
        self,
        ident: int,
        name: str,
        fake_tensor_tracker: FakeTensorTracker,
        storage_tracker: WorkerStorageTracker,
        cpu_tensors: TensorManager,
    ) -> None:
        self.id = ident
        self.name = name
        self.fake_tensor_tracker = fake_tensor_tracker
        self.task_queue: deque[Task] = deque()
        self.last_task: Task | None = None  # the last task that finished
        self.now = 0
        self.events: list[TraceEvent] = []
        self.memory = StreamMemoryTracker(storage_tracker)
        self.tensors = TensorManager(fake_tensor_tracker, self.memory)
        self.cpu_tensors = cpu_tensors

    def __repr__(self) -> str:
        return f"Stream({self.id}, {self.name!r}, queued={len(self.task_queue)}, now={self.now})"

    def add_task(self, task: Task) -> None:
        """Queue ``task``: it depends on the task before it, starts no earlier than this
        stream's clock, makes its outputs and holds its inputs (made on this stream,
        borrowed onto it, or the worker's CPU tensors) until it finishes."""
        task.start_time = max(self.now, task.start_time)
        for out in dict.fromkeys(task.outputs):
            if out in task.inputs:
                continue
            if out in self.tensors:
                self.tensors.incr_ref(out, task)
            else:
                self.tensors.add(out, (task,), task.start_time)
        for inp in dict.fromkeys(task.inputs):
            if inp in self.cpu_tensors:
                self.cpu_tensors.incr_ref(inp, task)
            elif inp in self.tensors:
                self.tensors.incr_ref(inp, task)
            else:
                raise KeyError(
                    f"task {task!r} on stream {self.name!r} reads tensor {inp}, which was "
                    "neither made on this stream, borrowed onto it, nor a CPU tensor"
                )
        before = self.task_queue[-1] if self.task_queue else self.last_task
        if before is not None:
            task.dependencies.append(before)
        self.task_queue.append(task)

    # -- borrows -------------------------------------------------------------------------

    def lend(self, borrow: Borrow) -> None:
        """This stream lends ``borrow.tensor_src_id``: it stays alive until returned."""
        self.tensors.incr_ref(borrow.tensor_src_id, borrow.ident)

    def return_borrow(self, borrow: Borrow) -> None:
        self.tensors.decr_ref(borrow.tensor_src_id, borrow.ident, self.now, None)

    def borrow(self, borrow: Borrow) -> None:
        """``borrow.tensor_dst_id`` is usable on this stream (it shares the lender's
        storage: no memory of its own)."""
        self.tensors.add(borrow.tensor_dst_id, (), self.now)
        self.tensors.first_use(borrow.tensor_dst_id, self.now, None)

    def borrow_drop(self, borrow: Borrow) -> None:
        """The borrower gave ``borrow`` back (the controller deletes its tensor)."""

    def delete_refs(self, tensor_ids: Iterable[int], now: int) -> None:
        """The controller deleted ``tensor_ids`` at ``now``: those made on this stream are
        freed once their last user finishes."""
        tb = _tb.extract_stack()
        for tensor_id in tensor_ids:
            if tensor_id in self.tensors:
                self.tensors.delete(tensor_id, max(self.now, now), tb)

    # -- progress ------------------------------------------------------------------------

    def maybe_set_ready(self) -> bool:
        return bool(self.task_queue) and self.task_queue[0].maybe_set_ready()

    def maybe_execute(self) -> bool:
        """Start the head task if it is ready (its outputs' memory is in use from its
        start). True if it started."""
        if not self.task_queue:
            return False
        task = self.task_queue[0]
        if not task.maybe_execute():
            return False
        for out in dict.fromkeys(task.outputs):
            if out not in task.inputs:
                self.tensors.first_use(out, task.start_time, task.traceback)
        return True

    def maybe_finish(self) -> tuple[Task | None, Task | None]:
        """Finish the head task if it can: (the task that finished before it, it), or
        ``(None, None)``."""
        if not self.task_queue or not self.task_queue[0].maybe_finish():
            return (None, None)
        task = self.task_queue.popleft()
        before, self.last_task = self.last_task, task
        if isinstance(task, EventTask):
            b = task.borrow
            if b is not None and b.tensor_src_id in self.tensors:
                self.tensors.decr_ref(b.tensor_src_id, b.ident, task.end_time, task.traceback)
        else:
            for tensor_id in dict.fromkeys([*task.inputs, *task.outputs]):
                owner = self.cpu_tensors if tensor_id in self.cpu_tensors else self.tensors
                owner.decr_ref(tensor_id, task, task.end_time, task.traceback)
        if task.end_time > task.start_time:
            self.events.append(
                TraceEvent(
                    task.start_time,
                    task.end_time - task.start_time,
                    task.meta,
                    task.command_id,
                    task.traceback,
                )
            )
        self.now = task.end_time
        return (before, task)

    def wait_event(self, event: EventTask) -> None:
        self.add_task(event)

    def record_event(self) -> Task:
        """The task an event recorded now on this stream completes with."""
        if self.task_queue:
            return self.task_queue[-1]
        if self.last_task is not None:
            return self.last_task
        raise RuntimeError(f"stream {self.name!r} has run no task: there is nothing to record")

    def clone(
        self,
        task_manager: WorkerTaskManager,
        storage_tracker: WorkerStorageTracker,
        cpu_tensors: TensorManager,
    ) -> Stream:
        """A copy whose tasks are ``task_manager``'s clones (``task_manager`` is a clone of
        the worker's), counting memory against ``storage_tracker``."""
        out = Stream(self.id, self.name, self.fake_tensor_tracker, storage_tracker, cpu_tensors)
        out.task_queue = deque(_live(task_manager, t) for t in self.task_queue)
        if self.last_task is not None:
            out.last_task = _live(task_manager, self.last_task)
        out.now = self.now
        out.events = copy.copy(self.events)
        out.memory = self.memory.clone(storage_tracker)
        out.tensors = self.tensors.clone(task_manager, out.memory)
        return out


def _live(task_manager: WorkerTaskManager, task: Task) -> Task:
    if task.task_id is None or task.task_id not in task_manager.tasks:
        raise RuntimeError(f"task {task!r} is not in the worker's task manager")
    return task_manager.tasks[task.task_id]


class Worker:
    """A simulated worker: its streams (by id), the tasks in flight, its CPU tensors and
    its CPU thread's events (one per command received). ``runtime`` prices a kernel
    launch (anything with ``get_runtime("kernel_launch")``, e.g.
    ``danaus.simulator.profiling.RuntimeEstimator``; 500 ns without one)."""

    def __init__(self, fake_tensor_tracker: FakeTensorTracker, runtime: Any = None) -> None:
        self.fake_tensor_tracker = fake_tensor_tracker
        self.runtime = runtime
        self.streams: dict[int, Stream] = {}
        self.default_stream_id = 0
        self.events: list[TraceEvent] = []
        self.wait_events: dict[int, EventTask] = {}  # borrow id -> the event to wait for
        self.borrows: dict[int, Borrow] = {}
        self.storage_tracker = WorkerStorageTracker(fake_tensor_tracker)
        self.cpu_tensors = TensorManager(fake_tensor_tracker, None)  # no CPU memory counted
        self.task_manager = WorkerTaskManager()

    def _launch_ns(self) -> int:
        if self.runtime is None:
            return KERNEL_LAUNCH_NS
        return int(self.runtime.get_runtime("kernel_launch"))

    def record_command(
        self, command: str, command_id: int, now: int, traceback: Sequence[_tb.FrameSummary]
    ) -> None:
        """The worker's CPU thread received ``command`` at ``now``."""
        meta: list[Any] = [command, *meta_stack()]
        self.events.append(TraceEvent(now, self._launch_ns(), meta, command_id, traceback))

    def create_stream(self, ident: int, name: str, default: bool) -> None:
        if ident in self.streams:
            raise ValueError(f"stream {ident} already exists on this worker")
        self.streams[ident] = Stream(
            ident, name, self.fake_tensor_tracker, self.storage_tracker, self.cpu_tensors
        )
        if default:
            self.default_stream_id = ident

    def add_task(self, task: Task, now: int, stream: int | None = None) -> None:
        """Queue ``task`` on ``stream`` (the default stream if ``None``), received at
        ``now``."""
        sid = self.default_stream_id if stream is None else stream
        if sid not in self.streams:
            raise KeyError(f"stream {sid} does not exist on this worker; create_stream first")
        self.record_command(str(task.meta[0]), task.command_id, now, task.traceback)
        self.streams[sid].add_task(task)
        self.task_manager.add(task)

    # -- borrows -------------------------------------------------------------------------

    def borrow(self, task: EventTask, borrow: Borrow) -> None:
        """Start ``borrow``: the lender's stream holds the tensor; ``task`` (recorded on
        the lender) is what the borrower waits for at first use."""
        self.streams[task.event_stream].lend(borrow)
        self.streams[task.wait_stream].borrow(borrow)
        self.wait_events[borrow.ident] = task
        self.borrows[borrow.ident] = borrow
        self.task_manager.add(task)

    def borrow_first_use(self, borrow_id: int, now: int) -> None:
        """The borrower first uses the tensor: its stream waits for the lender's event."""
        task = self.wait_events[borrow_id]
        self.record_command(str(task.meta[0]), task.command_id, now, task.traceback)
        self.streams[task.wait_stream].wait_event(task)

    def borrow_last_use(self, task: EventTask, borrow_id: int) -> None:
        """The borrower's last use: ``task`` (recorded on the borrower) is what the lender
        waits for when the borrow is dropped."""
        self.wait_events[borrow_id] = task
        self.task_manager.add(task)

    def borrow_drop(self, borrow_id: int, now: int) -> None:
        """The lender waits for the borrower's last use; the tensor is its own again (and
        freed, if deleted meanwhile) when that wait ends."""
        task = self.wait_events.pop(borrow_id)
        borrow = self.borrows.pop(borrow_id)
        self.record_command(str(task.meta[0]), task.command_id, now, task.traceback)
        task.borrow = borrow  # finishing the wait returns the borrow (Stream.maybe_finish)
        self.streams[task.wait_stream].wait_event(task)
        self.streams[task.event_stream].borrow_drop(borrow)

    # -- tensors -------------------------------------------------------------------------

    def add_cpu_tensor(self, tensor_id: int, ts: int) -> None:
        """A CPU tensor (made by the worker's CPU, e.g. a data loader): no task makes it."""
        self.cpu_tensors.add(tensor_id, (), ts)

    def delete_refs(self, tensor_ids: Iterable[int], ts: int) -> None:
        ids = list(tensor_ids)
        for tensor_id in ids:
            if tensor_id in self.cpu_tensors:
                self.cpu_tensors.delete(tensor_id, ts, None)
        for s in self.streams.values():
            s.delete_refs(ids, ts)

    # -- progress ------------------------------------------------------------------------

    def maybe_set_ready(self) -> bool:
        """Every stream's head task that can becomes ready; True if any did."""
        return any([s.maybe_set_ready() for s in self.streams.values()])

    def maybe_execute(self) -> bool:
        """Every stream's ready head task starts; True if any did."""
        return any([s.maybe_execute() for s in self.streams.values()])

    def maybe_finish(self) -> bool:
        """Every stream's head task that can finishes; True if any did. The task that
        finished before it on its stream is then no longer needed."""
        moved = False
        for s in self.streams.values():
            before, task = s.maybe_finish()
            if task is None:
                continue
            moved = True
            if before is not None and before.task_id in self.task_manager.tasks:
                self.task_manager.remove(before)
        return moved

    def pending(self) -> list[Task]:
        """The tasks queued on its streams and not finished."""
        return [t for s in self.streams.values() for t in s.task_queue]


class WorkerGroup(Worker):
    """A ``Worker`` standing for the ranks ``workers``, which received the same commands."""

    def __init__(
        self, workers: Any, fake_tensor_tracker: FakeTensorTracker, runtime: Any = None
    ) -> None:
        super().__init__(fake_tensor_tracker, runtime)
        self.workers = np.asarray(workers)

    def __repr__(self) -> str:
        return f"WorkerGroup({compress_workers_range(self.workers)})"

    def clone(self, workers: Any) -> WorkerGroup:
        """An independent copy of this group's state for the ranks ``workers``: tasks in
        flight (a collective in flight waits for both copies), streams, tensors, memory."""
        out = WorkerGroup(workers, self.fake_tensor_tracker, self.runtime)
        out.default_stream_id = self.default_stream_id
        out.events = copy.copy(self.events)
        out.borrows = dict(self.borrows)
        out.task_manager = self.task_manager.clone()
        out.storage_tracker = self.storage_tracker.clone()
        out.cpu_tensors = self.cpu_tensors.clone(out.task_manager, None)
        for ident, task in self.wait_events.items():
            live = task.task_id is not None and task.task_id in out.task_manager.tasks
            # an event that ran and left the task manager is copied on its own
            twin = _live(out.task_manager, task) if live else task.clone()
            out.wait_events[ident] = cast(EventTask, twin)
        for sid, s in self.streams.items():
            out.streams[sid] = s.clone(out.task_manager, out.storage_tracker, out.cpu_tensors)
        return out

    def split(self, split_set: Any) -> WorkerGroup:
        """Move the ranks ``split_set`` (some of this group's) to a new group with a copy
        of this one's state; returns the new group."""
        leaving = np.asarray(split_set)
        stray = np.setdiff1d(leaving, self.workers)
        if len(stray):
            raise ValueError(f"ranks {stray.tolist()} are not in {self!r}")
        self.workers = np.setdiff1d(self.workers, leaving, assume_unique=True)
        return self.clone(leaving)


def run_until_idle(workers: Iterable[Worker]) -> list[Task]:
    """Move every worker's tasks along until none can move; returns the tasks still queued
    (empty when everything ran; otherwise each waits for something that was never
    queued, such as a collective's peer on a worker not given here)."""
    ws = list(workers)
    while True:
        moved = False
        for w in ws:
            moved |= w.maybe_set_ready()
            moved |= w.maybe_execute()
            moved |= w.maybe_finish()
        if not moved:
            return [t for w in ws for t in w.pending()]


def _events(trace: Iterable[TraceEvent]) -> list[Event]:
    return [
        Event(e.start, e.runtime, str(e.meta[0]) if e.meta else "", e.command_id, tuple(e.meta[1:]))
        for e in trace
    ]


def write_trace(workers: Mapping[str, Worker], path: str) -> None:
    """Write ``workers`` (name -> worker) as a Chrome/Perfetto trace at ``path``: per
    worker its CPU thread, its streams and its GPU memory, as ``danaus.Simulator``'s
    trace shows them."""
    trace: list[dict[str, Any]] = []
    for pid, (name, w) in enumerate(workers.items(), start=1):
        trace.append(_meta("process_name", pid, 0, name))
        _dump_thread(trace, _events(w.events), pid, 0, "CPU")
        for s in w.streams.values():
            _dump_thread(trace, _events(s.events), pid, s.id + 1, s.name)
        merged = sorted(e for s in w.streams.values() for e in s.memory.events)
        cur = 0
        for ev in merged:
            cur += ev.delta
            trace.append(
                {
                    "name": "memory",
                    "cat": "memory",
                    "ph": "C",
                    "ts": ev.timestamp / 1000,
                    "pid": pid,
                    "args": {"allocated": cur / 10**6},
                }
            )
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"traceEvents": trace}, f)
