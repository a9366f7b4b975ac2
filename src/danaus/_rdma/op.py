"""One operation of a transfer (``Op``) and what it reads of the buffer it moves bytes
to or from (``BufferRef``, a Protocol that ``buffer.RDMABuffer`` implements, so the
transfer and the backends need not import the buffer module, which imports them)."""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

from .._wire.ids import ProcId
from .cuda import CudaInfo
from .memory import LocalMemory

__all__ = ["BufferRef", "Op"]


class BufferRef(Protocol):
    """An ``RDMABuffer`` as a transfer reads it: its owner (the actor, its proc and pid,
    its host), where the memory is in the owner (address, size, registry id), and which
    backend moves it (with that backend's descriptor, and the GPU's IPC handle)."""

    _owner_proc: ProcId
    _pid: int
    _host: str
    _addr: int
    _size: int
    _id: int
    _backend: str
    _desc: Any
    _cuda: CudaInfo | None

    @property
    def owner(self) -> str: ...


class Op(NamedTuple):
    """One transfer: ``nbytes`` between ``local`` and the start of ``buf``."""

    write: bool  # True: local -> buf; False: buf -> local
    buf: BufferRef
    local: LocalMemory
    nbytes: int

    def describe(self) -> str:
        verb = "write_from" if self.write else "read_into"
        return f"{verb} of {self.nbytes} bytes {'to' if self.write else 'from'} {self.buf}"
