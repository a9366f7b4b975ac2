"""``RDMABuffer`` (registered memory and its picklable handle) and ``RDMAAction`` (a batch).

The handle is a handful of integers and strings: the owner's proc and pid,
the memory's address and size, a buffer id and the owner actor's name. It
travels inside ordinary actor messages (the control plane); the bytes move
with ``read_into`` / ``write_from`` (the data plane) with no actor of the
owner taking part: copied by the kernel between the two processes on one
host, or over a data connection of their own across hosts (``net.py``).
"""

from __future__ import annotations

import concurrent.futures
import functools
import os
from typing import Any

from .._actor.core.collect import Collector, set_future
from .._actor.core.context import context
from .._actor.core.future import Future
from .._runtime.node import this_node
from .._wire.ids import ProcId
from .._wire.protocol import RdmaDrop
from . import backend as _backend
from . import cuda, net, plane, vm
from .memory import LocalMemory, local_memory, overlaps
from .op import BufferRef
from .registry import BufferRegistry
from .transfer import Op, Transfer, check_timeout, same_host

__all__ = [
    "RDMAAction",
    "RDMABuffer",
    "get_rdma_backend",
    "get_rdma_local_path",
    "gpu_direct_rdma_supported",
    "is_ibverbs_available",
    "is_rdma_available",
]

BACKEND = "process_vm"


def is_rdma_available() -> bool:
    """True if this platform can move bytes one-sidedly (Linux: ``process_vm_readv``)."""
    return vm.available()


def is_ibverbs_available() -> bool:
    """Always False: danaus does not use InfiniBand verbs (kept for Monarch programs)."""
    return False


def gpu_direct_rdma_supported() -> bool:
    """False: the built-in data plane never moves GPU memory over GPUDirect RDMA (never blocks).

    CUDA buffers move by CUDA IPC between the processes of one host (device to
    device, no host staging) and through pinned host memory, chunked and
    pipelined, across hosts; a buffer's ``backend`` says which.
    """
    return False


def get_rdma_backend() -> str:
    """Monarch's answer: ``"tcp"`` where buffers can be registered (Linux), else ``"none"``.

    One of Monarch's values (``"ibverbs"``, ``"tcp"``, ``"none"``); danaus never uses
    ibverbs. Between hosts the bytes travel over a TCP data connection; between the
    processes of one host they take a faster path, which ``get_rdma_local_path()`` names.
    """
    return "tcp" if vm.available() else "none"


def get_rdma_local_path() -> str:
    """How bytes move between processes of one host: ``"process_vm"`` (one kernel copy
    with ``process_vm_readv``/``writev``, no socket), or ``"none"`` where the platform
    lacks it (then no buffer can be registered). danaus's own; Monarch has no such call."""
    return BACKEND if vm.available() else "none"


# An RDMABuffer's fields, in the order a pickle carries them (``__reduce__``, ``_rebuild``).
_STATE = (
    "_owner_proc",
    "_pid",
    "_host",
    "_addr",
    "_size",
    "_id",
    "_owner",
    "_readonly",
    "_cuda",
    "_backend",
    "_desc",
)


class RDMABuffer(BufferRef):
    """Memory registered for one-sided reads and writes by whoever holds the handle.

    ``RDMABuffer(data)`` takes a contiguous CPU or CUDA ``torch.Tensor`` or
    a C-contiguous buffer (``bytearray``, writable ``memoryview``, numpy
    array) and does not copy it: the buffer *is* that memory (a CUDA
    tensor's GPU memory), kept alive by this process until `drop()`.
    Read-only memory (``bytes``) may be registered; such a buffer can be
    read but not written. Pickle the buffer
    (pass it to an endpoint) and the receiver can ``read_into`` /
    ``write_from`` it. Does not block. Raises ``ValueError`` for empty or
    non-contiguous memory, ``TypeError`` for other objects,
    ``NotImplementedError`` for a tensor neither on the CPU nor CUDA.

    The owner registers the buffer and hands it out (the ``danaus.rdma`` module's
    example); a receiver copies from and into it.

    Example:

        class Trainer(Actor):
            @endpoint
            def load(self, weights: RDMABuffer) -> int:
                self.local = bytearray(weights.size())
                weights.read_into(self.local).get()  # from the owner's memory
                return len(self.local)

        trainers.load.call(buf).get()
        buf.write_from(bytearray(buf.size())).get()  # zero the owner's copy
    """

    __slots__ = _STATE

    # and those of BufferRef: where the memory is, in which process, moved how
    _owner: str
    _readonly: bool

    def __init__(self, data: Any) -> None:
        if not vm.available():
            raise RuntimeError(
                "RDMABuffer needs Linux's process_vm_readv, which this platform lacks "
                "(get_rdma_local_path() == 'none'); send the data in an ordinary message instead"
            )
        mem = local_memory(data, "RDMABuffer data", allow_empty=False)
        node = this_node()
        rt = node.runtime
        net.install(node)
        vm.allow_peers(is_proc=bool(rt.boot))
        self._owner = str(context().actor_instance.actor_id)
        self._owner_proc = rt.proc_id
        self._pid = os.getpid()
        self._host = vm.host_key()
        self._addr = mem.addr
        self._size = mem.nbytes
        self._readonly = mem.readonly
        chosen = plane.choose(mem, node)
        if chosen is None:
            self._backend, self._desc = _backend.BUILTIN, None
            info = None if mem.host else cuda.export(mem)  # type: ignore[arg-type]
            self._cuda = info
            # The export holds a reference on the GPU memory until the buffer is dropped.
            on_free = None if info is None else functools.partial(cuda.release, info)
            self._id = node.part(BufferRegistry).register(mem, on_free=on_free)
        else:  # NIXL moves it, CUDA memory too: no CUDA IPC export of our own
            desc = chosen.register(mem)
            self._backend, self._desc, self._cuda = chosen.name, desc, None
            self._id = node.part(BufferRegistry).register(
                mem, on_free=lambda: chosen.unregister(desc)
            )

    # -- what it is --

    def size(self) -> int:
        """The number of bytes registered."""
        return self._size

    @property
    def owner(self) -> str:
        """The actor that registered the memory, as a string (``proc/mesh[rank]``)."""
        return self._owner

    @property
    def backend(self) -> str:
        """Which backend moves the bytes between here and the owner.

        ``"nixl"`` for a buffer its owner registered with NIXL (setting
        ``rdma_backend``); else the built-in plane's path from this process:
        ``"process_vm"`` on the owner's host, else ``"tcp"``. A CUDA buffer on the
        built-in plane: ``"cuda_ipc"`` where this process can open its CUDA IPC handle
        (the owner's host, a GPU this process sees), else ``"tcp"`` (staged through
        pinned host memory by the owner's data server).
        """
        if self._backend != _backend.BUILTIN:
            return self._backend
        node = this_node(start=False)
        rt = None if node is None else node.runtime
        if self._cuda is not None:
            local = rt is None or same_host(self, rt)
            return "cuda_ipc" if cuda.reachable(self._cuda, local) is None else "tcp"
        if rt is None or self._owner_proc.name == rt.proc_id.name or same_host(self, rt):
            return BACKEND
        return "tcp"

    @property
    def readonly(self) -> bool:
        """True if the registered memory is read-only (then only reads are allowed)."""
        return self._readonly

    # -- moving bytes --

    def read_into(self, dst: Any, *, timeout: float = 60) -> Future[None]:
        """Copy the buffer's bytes into the local ``dst``, when the future is first waited for.

        As in Monarch, the copy starts on the first ``get()``/``await`` of the
        returned future, not at the call: issue a read, then a write, await the
        write first, and the read sees what was written.

        ``dst`` (a writable contiguous tensor or buffer) must hold at least
        ``size()`` bytes; a larger ``dst`` gets the buffer in its leading
        bytes and the rest untouched. The owner may be on another host. The
        future fails with ``RDMAError`` (the buffer was dropped, or the copy
        failed), ``RDMAOwnerLostError`` (the owner's process died) or
        ``TimeoutError`` (after ``timeout`` seconds). Raises ``ValueError`` /
        ``TypeError`` for a bad ``dst``.

        Example:

            await buf.read_into(tensor)
        """
        t = check_timeout(timeout)
        op = self._read_op(dst, "read_into")
        return Transfer(this_node(), [op], t, f"read_into from {self}").lazy()

    def write_from(self, src: Any, *, timeout: float = 60) -> Future[None]:
        """Copy the local ``src`` into the buffer's leading bytes, when first waited for.

        The copy starts on the first ``get()``/``await`` of the returned future
        (see `read_into()`).

        ``src`` (a contiguous tensor or buffer, read-only allowed) must be no
        larger than ``size()``. Fails like `read_into()`; raises
        ``ValueError`` for a larger ``src`` or a read-only buffer.

        Example:

            buf.write_from(np.arange(10, dtype=np.int64)).get()
        """
        t = check_timeout(timeout)
        op = self._write_op(src, "write_from")
        return Transfer(this_node(), [op], t, f"write_from to {self}").lazy()

    def drop(self) -> Future[None]:
        """Release the registration: the owner stops holding the memory. Returns at once.

        Transfers that start after the drop, anywhere, fail with ``RDMAError``.
        Transfers already under way on the owner's host keep the memory
        pinned and finish first: the future completes once the last of them
        has ended (or its reader was lost, or its deadline passed by
        ``rdma_lease_grace``), and only then may the memory be freed or
        reused. Wait for it (``drop().get()``) before reusing the memory.
        Dropping twice, or after the owner died, is harmless.
        """
        node = this_node()
        rt = node.runtime
        what = f"drop of {self}"
        if self._owner_proc.name == rt.proc_id.name and self._pid == os.getpid():
            return Future._create(node.part(BufferRegistry).drop([self._id]), what)
        cf: concurrent.futures.Future[None] = concurrent.futures.Future()

        def on_value(index: int, ok: bool, value: Any) -> None:
            set_future(cf, ok, value)

        coll = Collector(rt, what, 1, on_value, lost_is_ok=True)
        coll.expect(0, self._owner_proc)
        rt.send(
            self._owner_proc,
            RdmaDrop((self._id,), coll.port, 0),
            on_fail=lambda reason: coll.fail(0, reason),
        )
        return Future._create(cf, what)

    def _read_op(self, dst: Any, what: str) -> Op:
        """The copy of this whole buffer into the local ``dst``, checked for ``what`` (the
        caller's name): ``dst`` must be writable and large enough."""
        mem = local_memory(dst, "dst")
        _check_writable(mem, "dst", what)
        if mem.nbytes < self._size:
            raise ValueError(
                f"dst ({mem.kind}) holds {mem.nbytes} bytes but {self} has {self._size}; "
                f"{what} needs a destination of at least {self._size} bytes"
            )
        return Op(False, self, mem, self._size)

    def _write_op(self, src: Any, what: str) -> Op:
        """The copy of the local ``src`` into this buffer's leading bytes, checked for
        ``what``: ``src`` must fit, and the buffer must be writable."""
        mem = local_memory(src, "src")
        if mem.nbytes > self._size:
            raise ValueError(
                f"src ({mem.kind}) has {mem.nbytes} bytes but {self} holds only {self._size}; "
                f"{what} needs a source of at most {self._size} bytes"
            )
        if self._readonly:
            raise ValueError(
                f"{self} was registered from read-only memory; it can be read, not written. "
                "Register writable memory (a bytearray, numpy array or tensor) to write to it"
            )
        return Op(True, self, mem, mem.nbytes)

    # -- identity and pickling --

    def __reduce__(self) -> Any:
        state = [getattr(self, name) for name in _STATE]
        state[0] = _fresh(self._owner_proc)
        return (_rebuild, tuple(state))

    def _key(self) -> tuple[str, int, int]:
        return (self._owner_proc.name, self._pid, self._id)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RDMABuffer) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __str__(self) -> str:
        gpu = f" on cuda:{self._cuda.device}" if self._cuda is not None else ""
        return f"RDMABuffer #{self._id} ({self._size} bytes{gpu}, owner {self._owner})"

    def __repr__(self) -> str:
        return f"<{self}>"


def _fresh(owner_proc: ProcId) -> ProcId:
    """The owner's proc with the freshest address this process knows.

    A buffer registered before its process listened on TCP (a client that
    attached to workers later) then travels with its TCP address too.
    """
    node = this_node(start=False)
    rt = None if node is None else node.runtime
    return rt.peers.resolve(owner_proc) if rt is not None else owner_proc


def _rebuild(*state: Any) -> RDMABuffer:
    """The buffer a pickle carries: the values of ``_STATE``'s fields (a pickle from
    before CUDA buffers and backends ends at ``_readonly``: host memory, built-in plane)."""
    buf = object.__new__(RDMABuffer)
    buf._cuda, buf._backend, buf._desc = None, _backend.BUILTIN, None
    for name, value in zip(_STATE, state, strict=False):  # an older pickle has fewer
        setattr(buf, name, value)
    return buf


def _check_writable(mem: LocalMemory, role: str, verb: str) -> None:
    if mem.readonly:
        raise ValueError(
            f"{role} ({mem.kind}) is read-only; {verb} writes into it. Pass writable memory: "
            "a bytearray, a writable numpy array or a tensor"
        )


def _check_buffer(buf: Any, role: str) -> RDMABuffer:
    if not isinstance(buf, RDMABuffer):
        raise TypeError(f"{role} must be an RDMABuffer, got {type(buf).__name__} {buf!r:.60}")
    return buf


class RDMAAction:
    """A batch of transfers submitted together; they run in parallel.

    Build it with `read_remote()` and `write_remote()` (each returns
    the action, so calls chain), then `submit()`. Two operations of one
    batch may not touch the same bytes where one of them writes: a local
    destination overlapping any other operation's local memory, or a write
    to a buffer another operation also uses, raises ``ValueError`` when the
    operation is added. ``submit`` can be called again to run the batch again.

    Example:

        RDMAAction().read_remote(a, buf_a).write_remote(buf_b, b).submit().get()
    """

    def __init__(self) -> None:
        self._ops: list[Op] = []

    def read_remote(self, dst: Any, buf: RDMABuffer) -> RDMAAction:
        """Add: copy ``buf`` into the local ``dst`` (as `RDMABuffer.read_into()`)."""
        return self._add(_check_buffer(buf, "buf")._read_op(dst, "read_remote"))

    def write_remote(self, buf: RDMABuffer, src: Any) -> RDMAAction:
        """Add: copy the local ``src`` into ``buf`` (as `RDMABuffer.write_from()`)."""
        return self._add(_check_buffer(buf, "buf")._write_op(src, "write_remote"))

    def read_into(self, src: RDMABuffer, dst: Any) -> RDMAAction:
        """Monarch's spelling of `read_remote()`: read buffer ``src`` into local ``dst``."""
        return self.read_remote(dst, src)

    def write_from(self, src: RDMABuffer, dst: Any) -> RDMAAction:
        """Monarch's spelling of `write_remote()`: write local ``dst`` into buffer ``src``."""
        return self.write_remote(src, dst)

    def fetch_add(self, src: RDMABuffer, dst: Any, add: int) -> RDMAAction:
        """Not supported (as in Monarch): raises ``NotImplementedError``."""
        raise NotImplementedError("RDMAAction.fetch_add is not supported")

    def compare_and_swap(self, src: RDMABuffer, dst: Any, compare: int, swap: int) -> RDMAAction:
        """Not supported (as in Monarch): raises ``NotImplementedError``."""
        raise NotImplementedError("RDMAAction.compare_and_swap is not supported")

    def _add(self, op: Op) -> RDMAAction:
        for i, other in enumerate(self._ops):
            if (not op.write or not other.write) and overlaps(op.local, other.local):
                raise ValueError(
                    f"RDMAAction: the local memory of this {_verb(op)} ({op.local!r}) "
                    f"overlaps that of operation #{i} ({_verb(other)}, {other.local!r}), and "
                    "one of them writes it; the operations of a batch run in parallel, so "
                    "the result would be undefined. Use separate memory, or submit two actions"
                )
            if (op.write or other.write) and op.buf == other.buf and op.nbytes and other.nbytes:
                raise ValueError(
                    f"RDMAAction: this {_verb(op)} and operation #{i} ({_verb(other)}) both "
                    f"use {op.buf} and one of them writes it; the operations of a batch run "
                    "in parallel, so the result would be undefined. Submit two actions instead"
                )
        self._ops.append(op)
        return self

    def submit(self, *, timeout: float = 60) -> Future[None]:
        """Start every operation; the future completes when all have, or fails with the first error.

        Returns at once. Failures are those of `RDMABuffer.read_into()`.
        """
        t = check_timeout(timeout)
        n = len(self._ops)
        what = f"RDMAAction of {n} transfer{'s' if n != 1 else ''}"
        return Transfer(this_node(), list(self._ops), t, what).lazy()

    def __len__(self) -> int:
        return len(self._ops)

    def __repr__(self) -> str:
        return f"<RDMAAction of {len(self._ops)} operations>"


def _verb(op: Op) -> str:
    return f"write_remote to {op.buf}" if op.write else f"read_remote from {op.buf}"
