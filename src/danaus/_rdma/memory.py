"""Local memory: the address, length and writability of a tensor or buffer, without a copy.

``local_memory(obj, role)`` accepts a contiguous CPU or CUDA ``torch.Tensor``
(CUDA memory is described by ``cuda.py``) or any
C-contiguous object with the buffer protocol (``bytearray``, ``memoryview``,
a numpy array, ``mmap``, ``bytes``) and returns a :class:`LocalMemory` that
keeps the object alive (and, for buffers, exported, so a ``bytearray`` cannot
be resized and move while we hold it). torch is never imported here: a
tensor is recognised only if the caller's program has imported torch already.
"""

from __future__ import annotations

import sys
from typing import Any

from . import vm

__all__ = ["LocalMemory", "local_memory", "overlaps"]

_ACCEPTED = (
    "a contiguous CPU or CUDA torch.Tensor, or a C-contiguous buffer (bytearray, memoryview, "
    "numpy array; bytes only where the memory is only read)"
)


class LocalMemory:
    """A contiguous range of this process's memory and the object that owns it."""

    __slots__ = ("addr", "keepalive", "kind", "nbytes", "readonly")
    host = True  # host memory (False: a GPU's, ``cuda.CudaMemory``)

    def __init__(self, addr: int, nbytes: int, readonly: bool, keepalive: Any, kind: str) -> None:
        self.addr = addr
        self.nbytes = nbytes
        self.readonly = readonly
        self.keepalive = keepalive  # holds the memory valid (and a buffer exported)
        self.kind = kind

    def __repr__(self) -> str:
        ro = ", read-only" if self.readonly else ""
        return f"<{self.kind} of {self.nbytes} bytes at {self.addr:#x}{ro}>"


def overlaps(a: LocalMemory, b: LocalMemory) -> bool:
    """True if the two ranges share at least one byte."""
    if a.nbytes == 0 or b.nbytes == 0:
        return False
    return a.addr < b.addr + b.nbytes and b.addr < a.addr + a.nbytes


def local_memory(obj: Any, role: str, *, allow_empty: bool = True) -> LocalMemory:
    """Describe ``obj``'s memory; ``role`` names the argument in error messages.

    Raises ``TypeError`` for an object that is neither a tensor nor a buffer,
    ``ValueError`` for non-contiguous memory (or empty memory when not
    ``allow_empty``), ``NotImplementedError`` for a tensor neither on the CPU nor CUDA.
    """
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        mem = _tensor_memory(obj, role)
    else:
        mem = _buffer_memory(obj, role)
    if mem.nbytes == 0 and not allow_empty:
        raise ValueError(
            f"{role} is empty ({mem.kind} of 0 bytes): an RDMABuffer needs at least one "
            "byte; pass a non-empty tensor or buffer"
        )
    return mem


def _tensor_memory(t: Any, role: str) -> LocalMemory:
    if t.device.type == "cuda":
        from .cuda import cuda_memory

        return cuda_memory(t, role)
    if t.device.type != "cpu":
        raise NotImplementedError(
            f"{role} is a tensor({tuple(t.shape)}, {t.dtype}) on device {str(t.device)!r}; "
            "danaus RDMA moves CPU and CUDA memory. Copy it to the CPU first (t.cpu())"
        )
    if t.layout is not sys.modules["torch"].strided:
        raise ValueError(
            f"{role} is a tensor with layout {t.layout}; pass a dense (strided) tensor, "
            "e.g. t.to_dense()"
        )
    if not t.is_contiguous():
        raise ValueError(
            f"{role} is a non-contiguous tensor (shape {tuple(t.shape)}, stride "
            f"{tuple(t.stride())}); pass t.contiguous() (a copy) or a contiguous view"
        )
    nbytes = t.numel() * t.element_size()
    kind = f"tensor({tuple(t.shape)}, {t.dtype})"
    # data_ptr() already includes the storage offset of a view.
    return LocalMemory(int(t.data_ptr()), nbytes, False, t, kind)


def _buffer_memory(obj: Any, role: str) -> LocalMemory:
    try:
        view = memoryview(obj)
    except TypeError:
        raise TypeError(
            f"{role} must be {_ACCEPTED}; got {type(obj).__name__} {_short(obj)}"
        ) from None
    except ValueError as e:  # e.g. a numpy dtype the buffer protocol cannot express
        raise ValueError(f"{role} cannot be used as memory ({e}); pass {_ACCEPTED}") from None
    kind = type(obj).__name__
    if not view.c_contiguous:
        hint = "np.ascontiguousarray(x)" if kind == "ndarray" else "a contiguous copy"
        raise ValueError(
            f"{role} is a non-contiguous {kind} (shape {view.shape}, strides {view.strides}); "
            f"pass {hint} or another C-contiguous buffer"
        )
    nbytes = view.nbytes
    if nbytes == 0:
        return LocalMemory(0, 0, view.readonly, view, kind)
    return LocalMemory(_address(view), nbytes, view.readonly, view, kind)


def _address(view: memoryview) -> int:
    """The address of a C-contiguous, non-empty memoryview's first byte."""
    return vm.address(view)


def _short(obj: Any) -> str:
    text = repr(obj)
    return text if len(text) <= 60 else text[:57] + "..."
