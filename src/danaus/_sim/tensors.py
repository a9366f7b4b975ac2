"""Tensors and memory of the task-queue workers (``tasks``/``workers``): Monarch's
``monarch.simulator.tensor``.

Tensors are fake (``danaus.common.fake.fake_call``): shape, dtype and device
without data. ``FakeTensorTracker`` holds one fake per tensor id for every
worker and stream of a simulation, and drops it when no worker holds the id.
``WorkerStorageTracker`` counts, per worker, the tensor ids on each storage
(views share their base's), giving each storage an address; memory changes
when a storage gets its first tensor or loses its last. ``StreamMemoryTracker``
turns those changes into a stream's memory timeline, and ``TensorManager``
keeps who still uses each tensor (queued tasks, borrows) so that a tensor the
controller deleted is freed only when its last user finishes.
"""

from __future__ import annotations

import copy
import heapq
import logging
import traceback as _tb
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from .tasks import Task, WorkerTaskManager

log = logging.getLogger("danaus.simulator")

Traceback = Sequence[_tb.FrameSummary]


class FakeTensorTracker:
    """The fake tensor of each live tensor id, shared by all workers and streams; an id is
    dropped when the last holder lets it go (``decr_ref``)."""

    def __init__(self) -> None:
        self.tensors: dict[int, Any] = {}
        self._refs: dict[int, int] = {}
        self._borrowed: set[int] = set()

    def add(self, tensors: dict[int, Any], is_borrowed: bool = False) -> None:
        """Know ``tensors`` (id -> fake tensor); a borrowed one shares storage the lender
        already counts."""
        self.tensors.update(tensors)
        if is_borrowed:
            self._borrowed.update(tensors)

    def is_borrowed(self, tensor_id: int) -> bool:
        return tensor_id in self._borrowed

    def incr_ref(self, tensor_id: int) -> None:
        if tensor_id not in self.tensors:
            raise KeyError(f"tensor {tensor_id} was never added to the FakeTensorTracker")
        self._refs[tensor_id] = self._refs.get(tensor_id, 0) + 1

    def decr_ref(self, tensor_id: int) -> None:
        n = self._refs.get(tensor_id, 0) - 1
        if n < 0:
            raise RuntimeError(f"tensor {tensor_id} is released more often than it was held")
        if n == 0:
            del self._refs[tensor_id]
            self.tensors.pop(tensor_id, None)
            self._borrowed.discard(tensor_id)
        else:
            self._refs[tensor_id] = n


def _storage_key(fake: Any) -> tuple[int, Any]:
    """The identity of ``fake``'s storage (shared by its views), and the storage."""
    storage = fake.untyped_storage()
    return storage._cdata, storage


class StorageEvent(NamedTuple):
    """A storage at ``address`` of ``delta`` bytes came into use (or left it)."""

    address: int
    delta: int


class WorkerStorageTracker:
    """The tensor ids on each storage of one worker, and the storages' addresses
    (128-byte aligned, never reused)."""

    def __init__(self, fake_tensor_tracker: FakeTensorTracker) -> None:
        self.fake_tensor_tracker = fake_tensor_tracker
        self.storages: dict[int, set[int]] = {}  # storage key -> tensor ids
        self.storage_addresses: dict[int, int] = {}
        self._held: dict[int, Any] = {}  # key -> storage (so the key is not reused)
        self._counted: set[int] = set()  # storages whose memory this worker counts
        self._next_address = 0

    def incr_ref(self, tensor_id: int) -> StorageEvent | None:
        """``tensor_id`` is in use: its storage's allocation if this is the storage's first
        tensor not borrowed (a borrowed tensor's storage is the lender's), else ``None``."""
        key, storage = _storage_key(self.fake_tensor_tracker.tensors[tensor_id])
        borrowed = self.fake_tensor_tracker.is_borrowed(tensor_id)
        ids = self.storages.get(key)
        if ids is not None:
            ids.add(tensor_id)
            if borrowed or key in self._counted:
                return None
            # the storage was seen only through borrows so far: it is this worker's now
            self._counted.add(key)
            return StorageEvent(self.storage_addresses[key], storage.nbytes())
        self.storages[key] = {tensor_id}
        self._held[key] = storage
        address = self._next_address
        self._next_address += 128
        self.storage_addresses[key] = address
        if borrowed:
            return None
        self._counted.add(key)
        return StorageEvent(address, storage.nbytes())

    def decr_ref(self, tensor_id: int) -> StorageEvent | None:
        """``tensor_id`` is gone: its storage's release if it was the storage's last
        tensor and the storage was counted, else ``None``."""
        key, storage = _storage_key(self.fake_tensor_tracker.tensors[tensor_id])
        ids = self.storages.get(key)
        if ids is None or tensor_id not in ids:
            raise RuntimeError(f"tensor {tensor_id} is released but its storage is not tracked")
        ids.remove(tensor_id)
        if ids:
            return None
        del self.storages[key]
        del self._held[key]
        address = self.storage_addresses.pop(key)
        if key not in self._counted:  # only borrows ever held it
            return None
        self._counted.discard(key)
        return StorageEvent(address, storage.nbytes())

    def clone(self) -> WorkerStorageTracker:
        """An independent copy (same fake tensors, same addresses)."""
        out = WorkerStorageTracker(self.fake_tensor_tracker)
        out.storages = {k: set(v) for k, v in self.storages.items()}
        out.storage_addresses = dict(self.storage_addresses)
        out._held = dict(self._held)
        out._counted = set(self._counted)
        out._next_address = self._next_address
        return out


class MemoryEvent(NamedTuple):
    """At ``timestamp`` (ns) the storage at ``address`` changed the memory in use by
    ``delta`` bytes. Ordered by time, a release before an allocation at the same time."""

    timestamp: int
    address: int
    delta: int
    traceback: Traceback

    def _key(self) -> tuple[int, int, int]:
        return (self.timestamp, self.delta, self.address)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, MemoryEvent):
            return NotImplemented
        return self._key() < other._key()

    def __gt__(self, other: object) -> bool:
        if not isinstance(other, MemoryEvent):
            return NotImplemented
        return self._key() > other._key()

    def __le__(self, other: object) -> bool:
        if not isinstance(other, MemoryEvent):
            return NotImplemented
        return self._key() <= other._key()

    def __ge__(self, other: object) -> bool:
        if not isinstance(other, MemoryEvent):
            return NotImplemented
        return self._key() >= other._key()


class StreamMemoryTracker:
    """The memory a stream's tensors use: ``usage`` (bytes now), ``peak``, and ``events``
    (a heap of ``MemoryEvent``: tasks finish out of time order across streams, so
    ``pop_event`` gives them back in time order)."""

    def __init__(self, storage_tracker: WorkerStorageTracker) -> None:
        self.storage_tracker = storage_tracker
        self.usage = 0
        self.peak = 0
        self.events: list[MemoryEvent] = []
        self._allocated_at: dict[int, int] = {}  # address -> when

    def incr_ref(self, ts: int, tensor_id: int, traceback: Traceback | None = None) -> None:
        """``tensor_id`` is made at ``ts``."""
        ev = self.storage_tracker.incr_ref(tensor_id)
        if ev is None or ev.delta == 0:  # shared storage, a borrow, or an empty tensor
            return
        self.usage += ev.delta
        self.peak = max(self.peak, self.usage)
        self._allocated_at[ev.address] = ts
        heapq.heappush(self.events, MemoryEvent(ts, ev.address, ev.delta, traceback or ()))

    def decr_ref(self, ts: int, tensor_id: int, traceback: Traceback | None = None) -> None:
        """``tensor_id`` is freed at ``ts``."""
        ev = self.storage_tracker.decr_ref(tensor_id)
        if ev is None or ev.delta == 0:
            return
        made = self._allocated_at.pop(ev.address, None)
        if made is None:
            raise RuntimeError(f"storage at address {ev.address} is freed but was never made")
        if made > ts:
            raise RuntimeError(
                f"storage at address {ev.address} is freed at {ts} ns, before it was made "
                f"at {made} ns"
            )
        self.usage -= ev.delta
        heapq.heappush(self.events, MemoryEvent(ts, ev.address, -ev.delta, traceback or ()))

    def pop_event(self) -> MemoryEvent:
        """The earliest memory event not popped yet."""
        return heapq.heappop(self.events)

    def timeline(self) -> list[tuple[int, int]]:
        """``(ts ns, bytes in use)`` after each event, in time order (the events stay)."""
        cur = 0
        out = []
        for ev in sorted(self.events):
            cur += ev.delta
            out.append((ev.timestamp, cur))
        return out

    def clone(self, storage_tracker: WorkerStorageTracker) -> StreamMemoryTracker:
        """A copy counting against ``storage_tracker`` (the clone's worker's)."""
        out = StreamMemoryTracker(storage_tracker)
        out.usage = self.usage
        out.peak = self.peak
        out.events = copy.copy(self.events)
        out._allocated_at = dict(self._allocated_at)
        return out


class TensorManager:
    """The tensors of one stream (or a worker's CPU tensors, with no ``memory``): for
    each id, who still uses it (queued tasks, borrow ids). A tensor is freed when the
    controller has deleted it (``delete``) and its last user is done."""

    def __init__(
        self, fake_tensor_tracker: FakeTensorTracker, memory: StreamMemoryTracker | None
    ) -> None:
        self.fake_tensor_tracker = fake_tensor_tracker
        self.memory = memory
        self.tensors: dict[int, set[Task | int]] = {}
        self.pending_delete_tensors: set[int] = set()
        self.delete_tracebacks: dict[int, Traceback | None] = {}

    def __contains__(self, tensor_id: object) -> bool:
        return tensor_id in self.tensors

    def add(self, tensor_id: int, refs: Iterable[Task | int], now: int) -> None:
        """``tensor_id`` is made (at ``now``), used by ``refs``."""
        log.debug("tensor %s made at %s", tensor_id, now)
        self.tensors[tensor_id] = set(refs)
        self.fake_tensor_tracker.incr_ref(tensor_id)

    def first_use(self, tensor_id: int, now: int, traceback: Traceback | None) -> None:
        """The task making ``tensor_id`` starts at ``now``: its memory is in use."""
        if self.memory is not None:
            self.memory.incr_ref(now, tensor_id, traceback)

    def incr_ref(self, tensor_id: int, ref: Task | int) -> None:
        if tensor_id not in self.tensors:
            raise KeyError(f"tensor {tensor_id} is used before it was made on this stream")
        self.tensors[tensor_id].add(ref)

    def decr_ref(
        self, tensor_id: int, ref: Task | int, now: int, traceback: Traceback | None
    ) -> None:
        """``ref`` is done with ``tensor_id`` at ``now``."""
        self.tensors[tensor_id].discard(ref)
        self._maybe_free(tensor_id, now, traceback)

    def delete(self, tensor_id: int, now: int, traceback: Traceback | None) -> None:
        """The controller deleted ``tensor_id``: freed now, or when its last user is done."""
        self.pending_delete_tensors.add(tensor_id)
        self._maybe_free(tensor_id, now, traceback)

    def _maybe_free(self, tensor_id: int, now: int, traceback: Traceback | None) -> None:
        if self.tensors[tensor_id]:
            return
        if tensor_id not in self.pending_delete_tensors:
            # unused but not deleted yet: remember where it was last used
            self.delete_tracebacks[tensor_id] = traceback
            return
        tb = traceback if traceback is not None else self.delete_tracebacks.pop(tensor_id, None)
        self.delete_tracebacks.pop(tensor_id, None)
        if self.memory is not None:
            self.memory.decr_ref(now, tensor_id, tb)
        del self.tensors[tensor_id]
        self.pending_delete_tensors.discard(tensor_id)
        self.fake_tensor_tracker.decr_ref(tensor_id)

    def clone(
        self,
        task_manager: WorkerTaskManager,
        memory: StreamMemoryTracker | WorkerStorageTracker | None,
    ) -> TensorManager:
        """A copy whose users are ``task_manager``'s clones of the tasks (borrow ids stay).
        ``memory``: the copy's memory tracker, or the storage tracker a copy of this one's
        memory tracker should count against (a manager without memory stays without)."""
        if isinstance(memory, WorkerStorageTracker):
            memory = self.memory.clone(memory) if self.memory is not None else None
        out = TensorManager(self.fake_tensor_tracker, memory)
        out.pending_delete_tensors = set(self.pending_delete_tensors)
        out.delete_tracebacks = dict(self.delete_tracebacks)
        for tensor_id, users in self.tensors.items():
            new: set[Task | int] = set()
            for u in users:
                if isinstance(u, Task):
                    if u.task_id is None or u.task_id not in task_manager.tasks:
                        raise RuntimeError(f"task {u!r} uses tensor {tensor_id} but is not live")
                    new.add(task_manager.tasks[u.task_id])
                else:
                    new.add(u)
            out.tensors[tensor_id] = new
        # a tensor held by both copies is released by each
        for tensor_id in out.tensors:
            self.fake_tensor_tracker.incr_ref(tensor_id)
        return out
