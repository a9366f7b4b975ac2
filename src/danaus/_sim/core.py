"""The simulated workers: streams of tasks on a simulated clock, memory, and the trace.

Times are integer nanoseconds. Each worker group (ranks that have received
exactly the same commands, see ``Simulator._ndslice_to_worker_group``) has
streams; a stream runs its tasks in order, each starting when the stream is
free and the controller has issued it (``now``, which only moves when the
controller waits for a value: ``fetch_shard``). Tasks that need another
stream (a borrow's first use, the wait after a borrow is dropped) start when
that stream reaches the matching signal; a collective starts when every
stream that joins it has reached it, and ends together on all of them.
Commands arrive in program order and every cross-stream dependency is
signalled before it is waited on, so each task's times are known when it
arrives: the simulation runs as the program issues commands, with no queue.

Memory is counted per storage, not per tensor (views and borrows share
their base's storage), from the start of the task that makes it to the
deletion of the last tensor using it; GPU and host memory separately.
"""

from __future__ import annotations

import enum
import itertools
import json
import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import auto
from typing import Any

import numpy as np

from .costs import FixedCosts

__all__ = [
    "Event",
    "Simulator",
    "SimulatorBackendMode",
    "SimulatorTraceMode",
    "WorkerGroup",
    "compress_workers_range",
    "file_path_with_iter",
]

log = logging.getLogger("danaus.simulator")


class SimulatorBackendMode(enum.Enum):
    """What the simulated backend does with the commands (Monarch's modes)."""

    SIMULATE = auto()  # simulate, write the trace at each step and at exit
    SIMULATE_WITH_REPORT_ONLY = auto()  # simulate, report times and memory, no trace file
    COMMAND_HISTORY = auto()  # only record the commands
    EVERYTHING = auto()  # SIMULATE and COMMAND_HISTORY

    @property
    def simulation_enabled(self) -> bool:
        return self is not SimulatorBackendMode.COMMAND_HISTORY

    @property
    def command_history_enabled(self) -> bool:
        return self in (SimulatorBackendMode.COMMAND_HISTORY, SimulatorBackendMode.EVERYTHING)


class SimulatorTraceMode(enum.Enum):
    """What the trace shows: the controller's commands, the workers' streams, or both."""

    CONTROLLER_TRACE_ONLY = auto()
    STREAM_ONLY = auto()
    EVERYTHING = auto()

    @property
    def stream_enabled(self) -> bool:
        return self in (SimulatorTraceMode.STREAM_ONLY, SimulatorTraceMode.EVERYTHING)

    @property
    def controller_enabled(self) -> bool:
        return self in (SimulatorTraceMode.CONTROLLER_TRACE_ONLY, SimulatorTraceMode.EVERYTHING)


def file_path_with_iter(file_path: str, iter_count: int) -> str:
    """``dir/trace.json`` -> ``dir/trace_<iter_count>.json`` (where step ``iter_count``'s
    trace goes)."""
    dir_path = os.path.dirname(file_path)
    base, dot, ext = os.path.basename(file_path).rpartition(".")
    if not dot:
        base, ext = ext, ""
    name = f"{base}_{iter_count}" + (f".{ext}" if ext else "")
    return os.path.join(dir_path, name)


def compress_workers_range(workers: Iterable[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"[0-2] [5-5]"``."""
    ws = sorted(int(w) for w in workers)
    if not ws:
        return ""
    out = []
    start = end = ws[0]
    for w in ws[1:]:
        if w == end + 1:
            end = w
        else:
            out.append(f"[{start}-{end}]")
            start = end = w
    out.append(f"[{start}-{end}]")
    return " ".join(out)


@dataclass
class Event:
    """A task as the trace shows it: ``start`` and ``dur`` in ns, ``name``, its command;
    ``cost``: the ns of work in it (``dur`` less any wait for other streams or ranks)."""

    start: int
    dur: int
    name: str
    command_id: int
    meta: tuple[Any, ...] = ()
    cost: int = 0

    @property
    def end(self) -> int:
        return self.start + self.dur


@dataclass
class _Stream:
    name: str
    free: int = 0  # when its last task ends
    events: list[Event] = field(default_factory=list)
    busy: int = 0  # ns of work (not waiting) so far

    def copy(self) -> _Stream:
        return _Stream(self.name, self.free, list(self.events), self.busy)


class WorkerGroup:
    """Ranks that have seen the same commands, simulated once. ``workers``: their ranks."""

    def __init__(self, workers: np.ndarray) -> None:
        self.workers = workers
        self.streams: dict[str, _Stream] = {}
        self.live: dict[int, int] = {}  # tensor id -> storage key
        self.storages: dict[int, list[Any]] = {}  # key -> [nbytes, refs, device]
        self.mem: dict[str, int] = {"cuda": 0, "cpu": 0}
        self.peak: dict[str, int] = {"cuda": 0, "cpu": 0}
        # (ts, seq, device, delta, stream)
        self.mem_events: list[tuple[int, int, str, int, str]] = []
        self.signals: dict[int, tuple[int, str]] = {}  # key -> (time, stream)

    def split(self, leaving: np.ndarray) -> WorkerGroup:
        """Move ``leaving`` (a subset of ``workers``) to a new group with this one's state."""
        self.workers = np.setdiff1d(self.workers, leaving, assume_unique=True)
        g = WorkerGroup(np.asarray(leaving))
        g.streams = {k: s.copy() for k, s in self.streams.items()}
        g.live = dict(self.live)
        g.storages = {k: list(v) for k, v in self.storages.items()}
        g.mem = dict(self.mem)
        g.peak = dict(self.peak)
        g.mem_events = list(self.mem_events)
        g.signals = dict(self.signals)
        return g

    @property
    def events(self) -> list[Event]:
        return [e for s in self.streams.values() for e in s.events]

    def stream(self, name: str) -> _Stream:
        s = self.streams.get(name)
        if s is None:
            s = self.streams[name] = _Stream(name)
        return s

    def __repr__(self) -> str:
        return f"WorkerGroup({compress_workers_range(self.workers)})"


_seq = itertools.count()


class Simulator:
    """The simulated workers of ``world_size`` ranks (Monarch's ``Simulator``).

    ``group_workers``: start with one group of all ranks and split it only
    where commands treat ranks differently (a simulation of thousands of
    ranks costs what its few distinct behaviours cost); otherwise each rank
    is its own group. ``trace_mode`` and ``trace_path`` say what ``step`` and
    ``exit`` write (a Chrome/Perfetto trace JSON). ``costs`` prices tasks (a
    ``danaus.simulator.FixedCosts`` by default). ``profile`` and
    ``replay_file`` are accepted for Monarch's signature; a replay file is not
    read (danaus records no command history: ``NotImplementedError``).
    """

    def __init__(
        self,
        *,
        world_size: int = 0,
        profile: bool = False,
        replay_file: str | None = None,
        trace_mode: SimulatorTraceMode = SimulatorTraceMode.EVERYTHING,
        upload_trace: bool = False,
        trace_path: str = "trace.json",
        group_workers: bool = False,
        costs: Any = None,
    ) -> None:
        if replay_file is not None:
            raise NotImplementedError(
                "Simulator(replay_file=...): danaus records no command history to replay; "
                "run the program under danaus.Simulator(...) instead"
            )
        if not isinstance(world_size, int) or world_size <= 0:
            raise ValueError(
                f"world_size={world_size!r} is not correct. Please specify a valid world_size "
                "(the number of simulated ranks, > 0)"
            )
        if costs is None:
            costs = FixedCosts()
        self.costs = costs
        self.world_size = world_size
        self.trace_mode = trace_mode
        self.upload_trace = upload_trace
        self.trace_path = os.path.abspath(trace_path)
        self.group_workers = group_workers
        self.now = 0  # the controller's simulated clock
        self.command_id = 0
        self.events: list[Event] = []  # the controller's (trace modes with the controller)
        if group_workers:
            self._worker_groups = [WorkerGroup(np.arange(world_size))]
        else:
            self._worker_groups = [WorkerGroup(np.array([r])) for r in range(world_size)]
        self._worker_group_mapping = np.zeros(world_size, dtype=np.int64)
        self._remap()
        self._version = 0  # bumps when a group splits
        self._cache: dict[Any, tuple[int, list[WorkerGroup]]] = {}

    # -- groups ---------------------------------------------------------------------------

    @property
    def workers(self) -> list[WorkerGroup]:
        return self._worker_groups

    def _remap(self) -> None:
        for i, g in enumerate(self._worker_groups):
            self._worker_group_mapping[g.workers] = i

    def _ndslice_to_worker_group(self, ranks: Sequence[Any]) -> Iterator[WorkerGroup]:
        """The groups of the ranks in ``ranks`` (``NDSlice``s), splitting groups that the
        slices cover only partly: the part outside the slices goes to a new group listed
        just after the old one."""
        arrays = [np.fromiter(iter(r), dtype=np.int64) for r in ranks]
        workers = np.unique(np.concatenate(arrays)) if arrays else np.zeros(0, np.int64)
        yield from self.groups_for(workers)

    def groups_for(self, workers: np.ndarray, key: Any = None) -> list[WorkerGroup]:
        """The groups holding ``workers`` (sorted ranks), split so that each is wholly
        inside; ``key`` caches the answer until the next split."""
        if key is not None:
            hit = self._cache.get(key)
            if hit is not None and hit[0] == self._version:
                return hit[1]
        groups = self._worker_groups
        counts = np.bincount(self._worker_group_mapping[workers], minlength=len(groups))
        touched = np.nonzero(counts)[0]
        if all(counts[i] == len(groups[i].workers) for i in touched):
            out = [groups[i] for i in touched]
        else:
            new: list[WorkerGroup] = []
            out = []
            for i, g in enumerate(groups):
                new.append(g)
                if counts[i] == 0:
                    continue
                out.append(g)
                if counts[i] < len(g.workers):
                    new.append(g.split(np.setdiff1d(g.workers, workers, assume_unique=True)))
            self._worker_groups = new
            self._remap()
            self._version += 1
            self._cache.clear()
        if key is not None:
            self._cache[key] = (self._version, out)
        return out

    # -- the clock and memory --------------------------------------------------------------

    def next_command(self, name: str | None) -> int:
        """A new command id; the controller's trace gets ``name`` at ``now`` (nothing for
        ``None``: a command that is part of another message in Monarch's controller)."""
        self.command_id += 1
        if name is not None and self.trace_mode.controller_enabled:
            self.events.append(Event(self.now, 0, name, self.command_id))
        return self.command_id

    def _record(
        self, s: _Stream, start: int, end: int, name: str, meta: tuple[Any, ...], cost: int = 0
    ) -> None:
        s.busy += cost
        if self.trace_mode.stream_enabled:
            s.events.append(Event(start, end - start, name, self.command_id, meta, cost))

    def task(
        self,
        groups: Iterable[WorkerGroup],
        stream: str,
        name: str,
        cost: int,
        meta: tuple[Any, ...] = (),
        traced: bool = True,
        earliest: int = 0,
    ) -> list[tuple[WorkerGroup, int, int]]:
        """Run a task of ``cost`` ns on ``stream`` of each group; returns (group, start, end)."""
        out = []
        for g in groups:
            s = g.stream(stream)
            start = max(s.free, self.now, earliest)
            end = start + cost
            s.free = end
            if traced:
                self._record(s, start, end, name, meta, cost)
            else:
                s.busy += cost
            out.append((g, start, end))
        return out

    def synchronised(
        self,
        components: list[list[WorkerGroup]],
        stream: str,
        name: str,
        cost: int,
        meta: tuple[Any, ...] = (),
        names: dict[int, str] | None = None,
    ) -> list[tuple[WorkerGroup, int, int]]:
        """A collective: in each component (groups whose ranks exchange data), it starts
        when every member's stream has reached it and ends ``cost`` later on all."""
        out = []
        for comp in components:
            ready = [max(g.stream(stream).free, self.now) for g in comp]
            end = max(ready) + cost
            for g, r in zip(comp, ready, strict=True):
                s = g.stream(stream)
                s.free = end
                label = names.get(id(g), name) if names else name
                self._record(s, r, end, label, meta, cost)
                out.append((g, r, end))
        return out

    def alloc(
        self, g: WorkerGroup, ref: int, key: int, nbytes: int, device: str, ts: int, stream: str
    ) -> None:
        """``ref`` now names storage ``key`` (of ``nbytes``), made at ``ts`` if new."""
        old = g.live.get(ref)
        if old is not None:
            self.free(g, ref, ts, stream)
        g.live[ref] = key
        st = g.storages.get(key)
        if st is not None:
            st[1] += 1
            return
        g.storages[key] = [nbytes, 1, device]
        self._mem(g, device, nbytes, ts, stream)

    def free(self, g: WorkerGroup, ref: int, ts: int, stream: str) -> None:
        """``ref`` is gone; its storage goes at ``ts`` with its last name."""
        key = g.live.pop(ref, None)
        if key is None:
            return
        st = g.storages[key]
        st[1] -= 1
        if st[1] == 0:
            del g.storages[key]
            self._mem(g, st[2], -st[0], ts, stream)

    def _mem(self, g: WorkerGroup, device: str, delta: int, ts: int, stream: str) -> None:
        if delta == 0:
            return
        dev = "cuda" if device != "cpu" else "cpu"
        g.mem[dev] += delta
        g.peak[dev] = max(g.peak[dev], g.mem[dev])
        g.mem_events.append((ts, next(_seq), dev, delta, stream))

    # -- reporting -------------------------------------------------------------------------

    def memory_timeline(self, g: WorkerGroup, device: str = "cuda") -> list[tuple[int, int]]:
        """``(ts ns, bytes in use)`` after each change of ``g``'s ``device`` memory."""
        cur = 0
        out = []
        for ts, _n, dev, delta, _s in sorted(g.mem_events):
            if dev == device:
                cur += delta
                out.append((ts, cur))
        return out

    def _report(self, trace_path: str = "") -> tuple[float, float]:
        """Write the trace to ``trace_path`` (if given); return (the simulated time in
        seconds, the peak GPU memory of any worker in MB)."""
        trace: list[dict[str, Any]] = []
        ids = itertools.count(1)
        exec_ns = 0
        peak = 0
        trace.append(_meta("process_name", 0, 0, "Controller"))
        exec_ns = max(exec_ns, _dump_thread(trace, self.events, 0, 0, "Controller"))
        groups = sorted(self._worker_groups, key=lambda g: int(g.workers.min()))
        for index, g in enumerate(groups):
            if not g.events and not g.mem_events:
                continue
            pid = next(ids)
            name = f"Device {index}"
            if self.group_workers:
                name = f"{name} {compress_workers_range(g.workers)}"
            trace.append(_meta("process_name", pid, 0, name))
            exec_ns = max(exec_ns, _dump_thread(trace, self.events, pid, 32000, name))
            for s in g.streams.values():
                exec_ns = max(exec_ns, _dump_thread(trace, s.events, pid, next(ids), s.name))
                exec_ns = max(exec_ns, s.free)
            for dev, counter, cat in (
                ("cuda", "memory", "memory"),
                ("cpu", "host memory", "host_memory"),
            ):
                cur = 0
                for ts, _n, d, delta, _s in sorted(g.mem_events):
                    if d != dev:
                        continue
                    cur += delta
                    if dev == "cuda":
                        peak = max(peak, cur)
                    trace.append(
                        {
                            "name": counter,
                            "cat": cat,
                            "ph": "C",
                            "ts": ts / 1000,
                            "pid": pid,
                            "args": {"allocated": cur / 10**6},
                        }
                    )
        if trace_path:
            os.makedirs(os.path.dirname(os.path.abspath(trace_path)), exist_ok=True)
            with open(trace_path, "w") as f:
                json.dump({"traceEvents": trace}, f)
        return exec_ns / 10**9, peak / 10**6

    def step(self, iter_count: int, dump_trace: bool = False) -> tuple[float, float]:
        """The simulated time so far (seconds) and the peak GPU memory (MB); with
        ``dump_trace``, the trace goes to ``file_path_with_iter(trace_path, iter_count)``."""
        path = file_path_with_iter(self.trace_path, iter_count) if dump_trace else ""
        self.costs.save()
        return self._report(path)

    def exit(self, iter_count: int, dump_trace: bool = False) -> tuple[float, float]:
        return self.step(iter_count, dump_trace)


def _meta(kind: str, pid: int, tid: int, name: str) -> dict[str, Any]:
    return {"name": kind, "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}}


def _dump_thread(
    trace: list[dict[str, Any]], events: list[Event], pid: int, tid: int, name: str
) -> int:
    trace.append(_meta("thread_name", pid, tid, name))
    last = 0
    for e in events:
        label = " ".join([e.name, *map(str, e.meta)])
        trace.append(
            {
                "name": label,
                "cat": "compute",
                "ph": "X",
                "ts": e.start / 1000,
                "dur": e.dur / 1000,
                "pid": pid,
                "tid": tid,
                "args": {"command": e.command_id},
                **({"cname": "rail_animation"} if "waiting" in label else {}),
            }
        )
        last = max(last, e.end)
    return last
