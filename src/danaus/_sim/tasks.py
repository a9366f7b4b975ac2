"""The task queue of a simulated worker: tasks, their states, and the worker's table of them.

This is Monarch's model of a worker (``monarch.simulator.task``), kept beside
danaus's own clock-driven simulator (``core``): a task is queued on a stream
and moves PENDING -> READY (every task it depends on has executed) ->
EXECUTING (it is at the head of its stream) -> EXECUTED (each peer of its
collective has started and each event it waits for has executed). Its end
time follows from that: a collective ends ``runtime`` after its last peer
started, a wait ends no earlier than the events it waits for.

``WorkerTaskManager`` numbers a worker's live tasks and clones them, with the
links between them (dependencies, waits, collective peers) pointing at the
clones, so that a group of simulated ranks can be split into two that go on
independently (``workers.WorkerGroup.split``).
"""

from __future__ import annotations

import copy
import enum
import traceback as _tb
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .._tensor.simulator import meta_stack, read_by_tasks

__all__ = ["Borrow", "EventTask", "Task", "TaskState", "TraceEvent", "WorkerTaskManager"]


read_by_tasks()  # set_meta labels every Task made from now on: it has an effect


class TaskState(enum.Enum):
    """Where a task is in its stream (in this order)."""

    PENDING = enum.auto()  # queued; some task it depends on has not executed
    READY = enum.auto()  # its dependencies have executed
    EXECUTING = enum.auto()  # at the head of its stream, running
    EXECUTED = enum.auto()  # finished: its end time is known


class TraceEvent:
    """A finished task as the trace shows it: ``start`` and ``runtime`` in ns (``end``
    their sum), its ``meta`` labels, the command it ran and where it was issued."""

    def __init__(
        self,
        start: int,
        runtime: int,
        meta: list[Any],
        command_id: int,
        traceback: Sequence[_tb.FrameSummary] = (),
    ) -> None:
        self.start = start
        self.runtime = runtime
        self.end = start + runtime
        self.meta = meta
        self.command_id = command_id
        self.traceback = traceback

    def __repr__(self) -> str:
        return f"TraceEvent({' '.join(map(str, self.meta))!r}, start={self.start}, end={self.end})"


class Task:
    """One command's work on one stream of one simulated worker.

    ``inputs``/``outputs``: the tensor ids it reads and writes; ``runtime``: its cost
    in ns; ``start_time``: the earliest it may start (the controller issued it then);
    ``meta``: its labels (the trace's name), to which the ``set_meta`` labels active
    when it is made are appended. ``collectives``: a list shared by the tasks of one
    collective on every rank (the task adds itself); ``waits``: tasks (of other
    streams) whose end it must wait for. ``dependencies`` (the tasks before it on its
    stream) are filled in when it is queued.
    """

    def __init__(
        self,
        inputs: list[int],
        outputs: list[int],
        command_id: int,
        start_time: int,
        runtime: int,
        meta: list[Any],
        collectives: list[Task] | None = None,
        waits: list[Task] | None = None,
        traceback: Sequence[_tb.FrameSummary] = (),
    ) -> None:
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.command_id = command_id
        self.start_time = start_time
        self.end_time = 0
        self.runtime = runtime
        self.meta = [*meta, *meta_stack()]
        self.dependencies: list[Task] = []
        self.collectives = collectives
        if collectives is not None:
            collectives.append(self)
        self.waits = waits
        self.traceback = traceback
        self._state = TaskState.PENDING
        self.task_id: int | None = None  # given by WorkerTaskManager.add

    def __repr__(self) -> str:
        return " ".join(map(str, self.meta))

    @property
    def state(self) -> TaskState:
        return self._state

    def maybe_set_ready(self) -> bool:
        """PENDING -> READY once every dependency has executed (the task then starts no
        earlier than the last of them ended). True if the state changed."""
        if self._state is not TaskState.PENDING:
            return False
        if any(d._state is not TaskState.EXECUTED for d in self.dependencies):
            return False
        for d in self.dependencies:
            self.start_time = max(self.start_time, d.end_time)
        self._state = TaskState.READY
        return True

    def maybe_execute(self) -> bool:
        """READY -> EXECUTING. True if the state changed."""
        if self._state is not TaskState.READY:
            return False
        self._state = TaskState.EXECUTING
        return True

    def maybe_finish(self) -> bool:
        """EXECUTING -> EXECUTED once every peer of its collective is executing (or
        done) and every task it waits for has executed; sets ``end_time``. True if the
        state changed."""
        if self._state is not TaskState.EXECUTING:
            return False
        peers = self.collectives or []
        if any(p._state not in (TaskState.EXECUTING, TaskState.EXECUTED) for p in peers):
            return False
        waits = self.waits or []
        if any(w._state is not TaskState.EXECUTED for w in waits):
            return False
        end = self.start_time + self.runtime
        if peers:  # the collective runs once its last member arrives, on every member
            end = max(end, max(p.start_time for p in peers) + self.runtime)
        if waits:
            end = max(end, max(w.end_time for w in waits))
        self.end_time = end
        self._state = TaskState.EXECUTED
        return True

    def clone(self) -> Task:
        """A shallow copy (the same lists of inputs, peers, ...): ``WorkerTaskManager.clone``
        relinks it."""
        return copy.copy(self)


@dataclass
class Borrow:
    """A borrow: ``tensor_src_id`` of stream ``from_stream`` used as ``tensor_dst_id`` on
    stream ``to_stream``; ``ident`` is its id."""

    ident: int
    tensor_src_id: int
    tensor_dst_id: int
    from_stream: int
    to_stream: int


class EventTask(Task):
    """Stream ``wait_stream`` waiting for ``recorded_task`` of stream ``event_stream``
    (a borrow's first use, or the lender waiting for the borrower's last use)."""

    def __init__(
        self,
        recorded_task: Task,
        event_stream: int,
        event_stream_name: str,
        wait_stream: int,
        wait_stream_name: str,
        start_time: int,
        command_id: int,
        runtime: int = 1,
        borrow: Borrow | None = None,
        traceback: Sequence[_tb.FrameSummary] = (),
    ) -> None:
        super().__init__(
            inputs=[],
            outputs=[],
            command_id=command_id,
            start_time=start_time,
            runtime=runtime,
            meta=["waiting for", event_stream_name],
            waits=[recorded_task],
            traceback=traceback,
        )
        self.event_stream = event_stream
        self.event_stream_name = event_stream_name
        self.wait_stream = wait_stream
        self.wait_stream_name = wait_stream_name
        self.borrow = borrow


class WorkerTaskManager:
    """The live tasks of one simulated worker, by id (ids count up from 0)."""

    def __init__(self) -> None:
        self.tasks: dict[int, Task] = {}
        self._next_id = 0

    def add(self, task: Task) -> int:
        """Give ``task`` the next id and keep it; returns the id."""
        task_id = self._next_id
        self._next_id += 1
        task.task_id = task_id
        self.tasks[task_id] = task
        return task_id

    def remove(self, task: Task) -> None:
        """Forget ``task`` (it executed and nothing waits on it any more)."""
        if task.task_id is None:
            raise ValueError(f"task {task!r} was never added to a WorkerTaskManager")
        if self.tasks.pop(task.task_id, None) is None:
            raise KeyError(f"task {task.task_id} ({task!r}) is not in this WorkerTaskManager")

    def clone(self) -> WorkerTaskManager:
        """A copy whose tasks are clones: each clone's dependencies and waits are the
        clones of the originals (a task already removed, which has executed, is copied on
        its own), and each clone joins its original's collective, so that a collective
        spanning two split groups waits for both. The copy numbers new tasks as this one
        does."""
        clones = {tid: t.clone() for tid, t in self.tasks.items()}
        detached: dict[int, Task] = {}

        def relink(t: Task) -> Task:
            if t.task_id is not None and t.task_id in clones and self.tasks[t.task_id] is t:
                return clones[t.task_id]
            if t._state is not TaskState.EXECUTED:
                raise RuntimeError(
                    f"task {t!r} is linked from a live task but is neither live nor executed"
                )
            key = id(t)
            if key not in detached:
                detached[key] = t.clone()
            return detached[key]

        for c in clones.values():
            c.dependencies = [relink(d) for d in c.dependencies]
            if c.waits is not None:
                c.waits = [relink(w) for w in c.waits]
            if c.collectives is not None:
                c.collectives.append(c)
        out = WorkerTaskManager()
        out.tasks = clones
        out._next_id = self._next_id
        return out
