"""One operation of a transfer (``Op``) and what it reads of the buffer it moves bytes
to or from (``BufferRef``, the base class of ``buffer.RDMABuffer``, so the transfer and
the backends need not import the buffer module, which imports them)."""

from __future__ import annotations

from typing import Any, NamedTuple

from .._wire.ids import ProcId
from .cuda import CudaInfo
from .memory import LocalMemory

__all__ = ["BufferRef", "Op"]


class BufferRef:
    """An ``RDMABuffer`` as a transfer reads it: its owner (the actor, its proc and pid,
    its host), where the memory is in the owner (address, size, registry id), and which
    backend moves it (with that backend's descriptor, and the GPU's IPC handle).

    The base class of ``buffer.RDMABuffer``, declaring the fields it sets, so that the
    transfer and the backends need not import the buffer module, which imports them."""

    __slots__ = ()

    _owner_proc: ProcId
    _pid: int
    _host: str
    _addr: int
    _size: int
    _id: int
    _backend: str  # the backend that moves it: "builtin" or "nixl" (backend.py)
    _desc: Any  # that backend's descriptor (None for the built-in plane)
    _cuda: CudaInfo | None  # the GPU and its IPC handle (None: host memory)

    @property
    def owner(self) -> str:
        """The actor that registered the memory, as a string (``proc/mesh[rank]``)."""
        raise NotImplementedError


class Op(NamedTuple):
    """One transfer: ``nbytes`` between ``local`` and the start of ``buf``."""

    write: bool  # True: local -> buf; False: buf -> local
    buf: BufferRef
    local: LocalMemory
    nbytes: int

    def describe(self) -> str:
        verb = "write_from" if self.write else "read_into"
        return f"{verb} of {self.nbytes} bytes {'to' if self.write else 'from'} {self.buf}"
