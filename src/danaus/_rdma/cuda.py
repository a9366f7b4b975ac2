"""CUDA memory on the data plane: device tensors as buffers, CUDA IPC, pinned staging.

``RDMABuffer(t)`` for a contiguous CUDA tensor registers its device memory
(`CudaMemory`) and exports a CUDA IPC handle of its storage
(``UntypedStorage._share_cuda_()``, what ``torch.multiprocessing`` sends).
Three routes move the bytes, chosen per operation:

    direct   the owner is this process, or is on this host and its GPU is one
             this process sees (same device UUID): the peer opens the IPC handle
             once (cached per buffer, `CudaHandles`) and copies device to
             device (or device to host) on a side stream; no host staging.
    staged   the local side is CUDA and the owner's memory is host memory
             reached by process_vm or TCP, or the owner's GPU memory is served
             by its data server (another host, or a GPU this process cannot
             see): fixed-size chunks (``rdma_cuda_chunk``) through pinned host
             slots, pipelined: the device copy of one chunk runs while the
             previous (write) or next (read) chunk is moved.
    served   the owner's data server (``net.py``) answering a FETCH or STORE of
             CUDA memory stages it the same way on its side.

Stream order (the caller's side): a copy first waits for the work already
queued on the local tensor's current stream (the stream current when
``read_into``/``write_from`` was called), and that stream waits for the copy's
end before its next work; the transfer's future completes only once the
bytes are in place. The owner's memory is read or written when the transfer
runs: the owner finishes its own GPU work on it before others transfer (work
queued before ``RDMABuffer(t)`` is ordered before a peer's first open).

torch is imported only when CUDA memory is met: the module stays importable
(and its pipeline logic testable) without a GPU.
"""

from __future__ import annotations

import collections
import ctypes
import logging
import sys
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

from .. import _config as config
from .memory import CudaMemory, LocalMemory, device_uuid

__all__ = [
    "CudaHandles",
    "CudaInfo",
    "CudaMemory",
    "available",
    "device_tensor",
    "direct_copy",
    "export",
    "host_tensor",
    "host_view",
    "owner_bytes",
    "reachable",
    "release",
    "serve_fetch",
    "serve_store",
    "staged_copy",
    "staged_in",
    "staged_out",
]

log = logging.getLogger("danaus.rdma")

SLOTS = 2  # pinned chunks per pipeline: one moving while the other is on the device
OPEN_MAX = 64  # opened IPC handles kept per process (least recently used goes first)
# What a peer passes to ``_new_shared_cuda`` instead of the owner's reference counter: a
# shared memory name nothing creates, so closing the handle decrements no counter (torch's
# deleter ignores a counter it cannot open). See `release()`.
NO_COUNTER = b"/danaus-no-cuda-ipc-counter"


def _torch() -> Any:
    import torch

    return torch


def available() -> bool:
    """True if this process can use CUDA (torch imported and a GPU visible); never initialises
    torch if the program has not imported it."""
    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_available())


# -- describing device memory ---------------------------------------------------------------


def host_tensor(addr: int, nbytes: int) -> Any:
    """``nbytes`` of this process's host memory at ``addr`` as a uint8 CPU tensor (no copy).

    The caller keeps the memory's owner alive while the tensor is used.
    """
    torch = _torch()
    if nbytes == 0:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer(host_view(addr, nbytes), dtype=torch.uint8)


def host_view(addr: int, nbytes: int) -> memoryview:
    """A writable byte view of ``nbytes`` of this process's host memory at ``addr``."""
    return memoryview((ctypes.c_char * nbytes).from_address(addr)).cast("B")


def device_tensor(addr: int, nbytes: int, index: int) -> Any:
    """``nbytes`` of this process's memory on GPU ``index`` at ``addr`` as a uint8 CUDA
    tensor (no copy, not owning: the caller keeps the memory alive), through
    ``__cuda_array_interface__`` (without a "stream" entry: no synchronisation)."""

    class _Iface:
        __cuda_array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (addr, False),
            "version": 3,
        }

    return _torch().as_tensor(_Iface(), device=f"cuda:{index}")


# -- the handle's CUDA part ---------------------------------------------------------------


def _usable() -> bool:
    """True if this process can use CUDA, importing torch if needed: a CUDA buffer's handle
    arrived, so opening it directly beats staging it through its owner's host memory."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


class CudaInfo(NamedTuple):
    """What a CUDA buffer's handle carries besides the address: the GPU and its IPC handle."""

    uuid: str  # the GPU's UUID: a peer opens the IPC handle only if it sees this GPU
    device: int  # the GPU's index in the owner
    kind: str  # the registered tensor, as errors name it
    ipc: tuple[Any, ...] | None  # UntypedStorage._share_cuda_()'s answer, or None
    start: int  # the buffer's first byte within the shared storage
    why_no_ipc: str | None  # why ipc is None


def export(mem: CudaMemory) -> CudaInfo:
    """The handle's CUDA part for registered ``mem``: its IPC handle (once; never fails:
    without one, peers stage through the owner's data server)."""
    t = mem.tensor
    storage = t.untyped_storage()
    start = int(t.data_ptr()) - int(storage.data_ptr())
    ipc: tuple[Any, ...] | None = None
    why: str | None = None
    try:
        ipc = tuple(storage._share_cuda_())
    except Exception as e:  # e.g. memory torch cannot share (expandable segments, ...)
        why = f"CUDA IPC export failed: {e}"
        log.info("RDMABuffer of %s: %s; peers will stage through host memory", mem.kind, why)
    return CudaInfo(mem.uuid, mem.device, mem.kind, ipc, start, why)


def release(info: CudaInfo) -> None:
    """The owner's buffer is dropped and no transfer pins it: return the reference that its
    export (``_share_cuda_()``) took on the memory, so that torch frees it once the tensor
    goes (else the memory stays in torch's IPC "limbo" for the process's life).

    Peers may keep the handle open after that (they never read it again: the owner refuses
    a dropped buffer's transfers); they do not count (see ``CudaHandles.storage``).
    """
    if info.ipc is None:
        return
    torch = _torch()
    torch.UntypedStorage._release_ipc_counter_cuda(info.ipc[4], info.ipc[5])
    torch.cuda.ipc_collect()  # frees the memory now if the tensor already went


def reachable(info: CudaInfo, same_host: bool) -> str | None:
    """None if this process can open ``info``'s IPC handle, else why not (in words)."""
    if not same_host:
        return "the owner is on another host"
    if info.ipc is None:
        return info.why_no_ipc or "the owner exported no CUDA IPC handle"
    if not _usable():
        return "this process cannot use CUDA (torch is not installed, or sees no GPU)"
    if local_index(info.uuid) is None:
        return f"this process does not see the owner's GPU {info.uuid} (CUDA_VISIBLE_DEVICES)"
    return None


def local_index(uuid: str) -> int | None:
    """This process's index of the GPU with ``uuid``, or None if it does not see it."""
    torch = _torch()
    for i in range(torch.cuda.device_count()):
        if device_uuid(i) == uuid:
            return i
    return None


class CudaHandles:
    """The node's part for CUDA IPC: handles opened here, by buffer (least recently used
    closed first beyond ``OPEN_MAX``; those of a lost owner closed at once).

    Closing one lets its owner free the memory once it has dropped the buffer (torch's
    IPC reference count); an open handle never lets memory be freed under it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards _open
        self._open: collections.OrderedDict[tuple[str, int, int], Any] = collections.OrderedDict()
        self._watching = False

    def storage(self, key: tuple[str, int, int], info: CudaInfo) -> Any:
        """The owner's shared storage for buffer ``key`` (opened once), on this process's
        index of its GPU."""
        with self._lock:
            found = self._open.get(key)
            if found is not None:
                self._open.move_to_end(key)
                return found
        index = local_index(info.uuid)
        assert info.ipc is not None and index is not None  # checked by reachable()
        # ``_share_cuda_()``'s answer: (device, handle, size, offset, counter handle, counter
        # offset, event handle, event sync required). torch counts one reference per export
        # and expects exactly one opener to return it; a buffer's one export is opened by any
        # number of peers (or none), so the owner returns it itself when the buffer is
        # dropped (`release()`) and no peer touches the counter.
        _, handle, size, offset, _, _, event, sync = info.ipc
        args = (index, handle, size, offset, NO_COUNTER, 0, event, sync)
        torch = _torch()
        try:
            with torch.cuda.device(index):
                storage = torch.UntypedStorage._new_shared_cuda(*args)
        except RuntimeError as e:
            raise RuntimeError(
                f"opening the owner's CUDA IPC handle of {info.kind} on this process's "
                f"cuda:{index} failed: {e}. Where the platform lacks CUDA IPC (some "
                "sandboxes), register host memory instead, or let the owner listen on TCP "
                "(a worker host) so that its data server stages the bytes"
            ) from e
        with self._lock:
            self._open[key] = storage
            while len(self._open) > OPEN_MAX:
                self._open.popitem(last=False)
        return storage

    def forget(self, proc: str, reason: str = "") -> None:
        """Close the handles opened from proc ``proc`` (it is lost)."""
        with self._lock:
            for key in [k for k in self._open if k[0] == proc]:
                del self._open[key]

    def opened(self) -> int:
        """How many handles are open (for inspection and tests)."""
        with self._lock:
            return len(self._open)

    def watch(self, rt: Any) -> None:
        """Close a lost owner's handles (idempotent)."""
        with self._lock:
            if self._watching:
                return
            self._watching = True
        rt.peers.lost_callbacks.append(self.forget)

    def on_node_end(self) -> None:
        with self._lock:
            self._open.clear()


def owner_bytes(
    info: CudaInfo,
    key: tuple[str, int, int],
    addr: int,
    nbytes: int,
    own: bool,
    handles: CudaHandles,
) -> tuple[Any, int]:
    """The owner's registered GPU memory as a uint8 CUDA tensor here, and its device index
    here: the memory itself when this process owns it (``own``), else its opened IPC handle."""
    torch = _torch()
    if own:
        return device_tensor(addr, nbytes, info.device), info.device
    storage = handles.storage(key, info)
    index = int(storage.device.index)
    out = torch.empty(0, dtype=torch.uint8, device=storage.device)
    return out.set_(storage, info.start, (nbytes,)), index


# -- copies without staging ---------------------------------------------------------------


def _run_on(stream_of: Any, device: int, issue: Callable[[Any], None]) -> None:
    """Run ``issue(copy_stream)`` on a side stream of ``device`` ordered after ``stream_of``
    (the caller's stream, or None), make ``stream_of`` wait for it, and wait for its end."""
    torch = _torch()
    with torch.cuda.device(device):
        side = torch.cuda.Stream(device=device)
        # This thread's current stream holds the wait for the owner's export event (torch
        # queues it there when it opens an IPC handle); the caller's stream, its own work.
        side.wait_stream(torch.cuda.current_stream())
        if stream_of is not None:
            side.wait_stream(stream_of)
        with torch.cuda.stream(side):
            issue(side)
        done = side.record_event()
        if stream_of is not None:
            stream_of.wait_event(done)
        done.synchronize()


def direct_copy(
    write: bool, local: LocalMemory, remote: Any, off: int, n: int, remote_device: int | None
) -> None:
    """Copy ``n`` bytes at ``off`` between ``local`` and ``remote`` (a uint8 tensor over the
    whole buffer: device memory, or host memory) without staging. Blocks until done."""
    if n == 0:
        return
    device: int | None = remote_device
    stream: Any = None
    if isinstance(local, CudaMemory):
        loc = local.bytes_view(off, n)
        stream, device = local.stream, local.device
    else:
        loc = host_tensor(local.addr + off, n)
    rem = remote[off : off + n]
    assert device is not None, "a direct copy involves at least one GPU"
    dst, src = (rem, loc) if write else (loc, rem)

    def issue(side: Any) -> None:
        dst.copy_(src, non_blocking=True)

    _run_on(stream, device, issue)


# -- staged copies: the pipeline -----------------------------------------------------------


def chunk_size(unit: int) -> int:
    """``rdma_cuda_chunk`` rounded up to a whole number of ``unit`` bytes (the data
    connection's tag chunk, so staged payloads are framed as host memory's are)."""
    size = max(int(config.get("rdma_cuda_chunk")), unit)
    return -(-size // unit) * unit


def staged_in(
    total: int,
    chunk: int,
    move: Callable[[int, int, int], bool],
    upload: Callable[[int, int, int], Any],
    wait: Callable[[Any], None],
    stop: Callable[[], bool],
    slots: int = SLOTS,
) -> bool:
    """Bytes arriving into device memory, chunk by chunk, through ``slots`` host slots.

    ``move(slot, off, n)`` fills host slot ``slot`` with bytes ``off..off+n`` (blocking;
    False: stopped); ``upload(slot, off, n)`` starts copying the slot to the device and
    returns something ``wait`` blocks on. Chunk k+1 is moved while chunk k is uploaded;
    a slot is reused only once its upload has ended. False if stopped early (the
    uploads already started have ended when it returns, whatever happens).
    """
    pending: list[Any] = [None] * slots
    try:
        for k, off in enumerate(range(0, total, chunk)):
            if stop():
                return False
            s = k % slots
            if pending[s] is not None:
                wait(pending[s])
                pending[s] = None
            n = min(chunk, total - off)
            if not move(s, off, n):
                return False
            pending[s] = upload(s, off, n)
        return True
    finally:
        for ev in pending:
            if ev is not None:
                wait(ev)


def staged_out(
    total: int,
    chunk: int,
    download: Callable[[int, int, int], Any],
    move: Callable[[int, int, int], bool],
    wait: Callable[[Any], None],
    stop: Callable[[], bool],
    slots: int = SLOTS,
) -> bool:
    """Bytes leaving device memory, chunk by chunk, through ``slots`` host slots.

    ``download(slot, off, n)`` starts copying bytes ``off..off+n`` of the device memory
    into host slot ``slot`` and returns something ``wait`` blocks on; ``move(slot, off,
    n)`` sends the slot on (blocking; False: stopped). The downloads of the next
    ``slots - 1`` chunks run while chunk k is moved. False if stopped early (the
    downloads already started have ended when it returns, whatever happens).
    """
    offs = list(range(0, total, chunk))
    pending: dict[int, Any] = {}

    def issue(k: int) -> None:
        pending[k] = download(k % slots, offs[k], min(chunk, total - offs[k]))

    try:
        for k in range(min(slots, len(offs))):
            issue(k)
        for k, off in enumerate(offs):
            if stop():
                return False
            wait(pending.pop(k))
            if not move(k % slots, off, min(chunk, total - off)):
                return False
            if k + slots < len(offs):
                issue(k + slots)
        return True
    finally:
        for ev in pending.values():
            wait(ev)


class _Slots:
    """Pinned host slots and a side stream on one GPU: what a staged copy runs through."""

    def __init__(self, mem: CudaMemory, chunk: int, slots: int = SLOTS) -> None:
        torch = _torch()
        self.mem = mem
        self.side = torch.cuda.Stream(device=mem.device)
        with torch.cuda.device(mem.device):
            self.side.wait_stream(mem.stream)  # the work already queued comes first
        self.host = [torch.empty(chunk, dtype=torch.uint8, pin_memory=True) for _ in range(slots)]
        self.view = mem.bytes_view()

    def addr(self, slot: int) -> int:
        return int(self.host[slot].data_ptr())

    def upload(self, slot: int, off: int, n: int) -> Any:
        with _torch().cuda.stream(self.side):
            self.view[off : off + n].copy_(self.host[slot][:n], non_blocking=True)
            return self.side.record_event()

    def download(self, slot: int, off: int, n: int) -> Any:
        with _torch().cuda.stream(self.side):
            self.host[slot][:n].copy_(self.view[off : off + n], non_blocking=True)
            return self.side.record_event()

    @staticmethod
    def wait(event: Any) -> None:
        event.synchronize()

    def finish(self) -> None:
        """The caller's stream waits for every copy of this pipeline (its next work follows)."""
        self.mem.stream.wait_event(self.side.record_event())


def staged_copy(
    write: bool,
    local: CudaMemory,
    off: int,
    n: int,
    move: Callable[[int, int, int], bool],
    stop: Callable[[], bool],
    unit: int,
    slots_for: Callable[[Any, int], Any] | None = None,
) -> bool:
    """Move bytes ``off..off+n`` between CUDA ``local`` and a peer reached through host
    memory: ``move(host_addr, off, k)`` moves ``k`` bytes at buffer offset ``off`` between
    the host address and the peer (a process_vm copy or a data-connection request;
    blocking; False: stopped). Pipelined through pinned slots of ``chunk_size(unit)``
    bytes (``slots_for(local, chunk)``: `_Slots` unless a test stands in for the
    GPU); False if stopped early."""
    if n == 0:
        return True
    chunk = min(chunk_size(unit), n)
    slots = (slots_for or _Slots)(local, chunk)
    base = off

    def hop(slot: int, o: int, k: int) -> bool:
        return move(slots.addr(slot), base + o, k)

    def down(slot: int, o: int, k: int) -> Any:
        return slots.download(slot, base + o, k)

    def up(slot: int, o: int, k: int) -> Any:
        return slots.upload(slot, base + o, k)

    try:
        if write:
            return staged_out(n, chunk, down, hop, slots.wait, stop)
        return staged_in(n, chunk, hop, up, slots.wait, stop)
    finally:
        slots.finish()


# -- the owner's data server: FETCH and STORE of CUDA memory -----------------------------------


def serve_fetch(
    mem: CudaMemory,
    offset: int,
    nbytes: int,
    send: Callable[[memoryview], None],
    unit: int,
    slots_for: Callable[[Any, int], Any] | None = None,
) -> None:
    """Send ``mem``'s bytes ``offset..offset+nbytes`` chunk by chunk (``send`` each pinned
    chunk in order), the download of the next chunk overlapping the send of this one."""
    if nbytes == 0:
        return
    chunk = min(chunk_size(unit), nbytes)
    slots = (slots_for or _Slots)(mem, chunk)

    def down(slot: int, o: int, k: int) -> Any:
        return slots.download(slot, offset + o, k)

    def hop(slot: int, o: int, k: int) -> bool:
        send(host_view(slots.addr(slot), k))
        return True

    try:
        staged_out(nbytes, chunk, down, hop, slots.wait, lambda: False)
    finally:
        slots.finish()


def serve_store(
    mem: CudaMemory,
    offset: int,
    nbytes: int,
    recv: Callable[[memoryview, int], None],
    unit: int,
    slots_for: Callable[[Any, int], Any] | None = None,
) -> None:
    """Receive bytes ``offset..offset+nbytes`` of ``mem`` chunk by chunk (``recv(view, off)``
    fills each pinned chunk; it raises to stop), the upload of one chunk overlapping the
    receipt of the next; every chunk received before a failure has landed."""
    if nbytes == 0:
        return
    chunk = min(chunk_size(unit), nbytes)
    slots = (slots_for or _Slots)(mem, chunk)

    def hop(slot: int, o: int, k: int) -> bool:
        recv(host_view(slots.addr(slot), k), o)
        return True

    def up(slot: int, o: int, k: int) -> Any:
        return slots.upload(slot, offset + o, k)

    try:
        staged_in(nbytes, chunk, hop, up, slots.wait, lambda: False)
    finally:
        slots.finish()
