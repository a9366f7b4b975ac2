"""Copies on this host: the node's copy threads, how a copy is split among them, and
the copy itself (memmove, process_vm, CUDA)."""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from .._runtime.messaging.runtime import Runtime
from .._runtime.node import Node
from . import cuda, vm
from .cuda import CudaHandles
from .op import Op

__all__ = ["CopyThreads", "copy_bytes"]

SPLIT_MIN = 32 << 20  # a copy at least this large is split across worker threads
PART_MIN = 16 << 20  # ... into parts of at least this many bytes
PAGE = 4096  # what staged chunks of a process_vm copy are rounded to


class CopyThreads:
    """The node's part for copies: the threads that run them (started as needed).

    Ended with the node (``shutdown_context()``): the threads end once the copies
    already handed to them are done, and a client that starts again gets new ones.
    A forked proc starts a node of its own, so it never shares them with its parent.
    """

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(max_workers=_workers(), thread_name_prefix="danaus-rdma")

    def on_node_end(self) -> None:
        self.pool.shutdown(wait=False)


def _workers() -> int:
    return max(4, min(16, 2 * (os.cpu_count() or 1)))


def _split(nbytes: int) -> list[tuple[int, int]]:
    """``(offset, length)`` parts of a copy: one, or one per core for a large copy."""
    if nbytes < SPLIT_MIN:
        return [(0, nbytes)] if nbytes else []
    n = max(1, min(os.cpu_count() or 1, 8, nbytes // PART_MIN))
    step = -(-nbytes // n)
    step = (step + 4095) & ~4095  # page-aligned parts
    return [(off, min(step, nbytes - off)) for off in range(0, nbytes, step)]


def served(op: Op) -> bool:
    """True if ``op``'s buffer is GPU memory this process cannot open by CUDA IPC (a GPU
    it does not see): its owner's data server stages it, as for another host."""
    return op.buf._cuda is not None and cuda.reachable(op.buf._cuda, True) is not None


def parts(op: Op) -> list[tuple[int, int]]:
    """A copy's parts for worker threads: one for a direct device copy (a single copy
    engine transfer is fastest), as for host memory otherwise."""
    if op.buf._cuda is not None:
        return [(0, op.nbytes)] if op.nbytes else []
    return _split(op.nbytes)


def entry(op: Op) -> tuple[int, int, int]:
    return (op.buf._id, op.buf._addr, op.buf._size)


def copy_bytes(
    op: Op, off: int, n: int, local: bool, stop: Callable[[], bool], node: Node, rt: Runtime
) -> bool:
    """Copy ``n`` bytes at ``off`` of ``op`` on this host (a worker thread): a memmove for
    this process's own buffer, process_vm for another proc's, CUDA where GPU memory is on
    either side. False if ``stop()`` ended it first; raises ``OSError`` or (CUDA)
    ``RuntimeError``."""
    if op.buf._cuda is not None or not op.local.host:  # GPU memory on either side
        return _copy_cuda(op, off, n, local, stop, node, rt)
    if local:  # our own buffer: a plain memmove, no system call needed
        if op.write:
            dst, src = op.buf._addr, op.local.addr
        else:
            dst, src = op.local.addr, op.buf._addr
        return vm.memmove(dst + off, src + off, n, stop=stop)
    return vm.copy(
        op.buf._pid, op.local.addr + off, op.buf._addr + off, n, write=op.write, stop=stop
    )


def _copy_cuda(
    op: Op, off: int, n: int, local: bool, stop: Callable[[], bool], node: Node, rt: Runtime
) -> bool:
    """A copy on this host with GPU memory on either side (``cuda.py``): direct where
    the owner's GPU memory is reachable, staged through pinned host memory where the
    owner's memory is host memory reached by process_vm."""
    buf = op.buf
    if buf._cuda is not None:  # the owner's GPU memory: its own, or its IPC handle
        handles = node.part(CudaHandles)
        handles.watch(rt)
        key = (buf._owner_proc.name, buf._pid, buf._id)
        # This process's own memory even when another proc of it (a simulated one)
        # registered it: CUDA refuses to open an IPC handle in the process that made it.
        own = local or buf._pid == os.getpid()
        remote, device = cuda.owner_bytes(buf._cuda, key, buf._addr, buf._size, own, handles)
        cuda.direct_copy(op.write, op.local, remote, off, n, device)
        return True
    assert isinstance(op.local, cuda.CudaMemory)
    if local:  # host memory of this process: one copy, no staging needed
        remote = cuda.host_tensor(buf._addr, buf._size)
        cuda.direct_copy(op.write, op.local, remote, off, n, None)
        return True

    def move(addr: int, o: int, k: int) -> bool:
        return vm.copy(buf._pid, addr, buf._addr + o, k, write=op.write, stop=stop)

    return cuda.staged_copy(op.write, op.local, off, n, move, stop, PAGE)
