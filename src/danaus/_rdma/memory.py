"""Local memory: the address, length and writability of a tensor or buffer, without a copy.

``local_memory(obj, role)`` accepts a contiguous CPU or CUDA ``torch.Tensor``
(`CudaMemory`: its GPU memory, moved by ``cuda.py``) or any
C-contiguous object with the buffer protocol (``bytearray``, ``memoryview``,
a numpy array, ``mmap``, ``bytes``) and returns a `LocalMemory` that
keeps the object alive (and, for buffers, exported, so a ``bytearray`` cannot
be resized and move while we hold it). torch is never imported here: a
tensor is recognised only if the caller's program has imported torch already.
"""

from __future__ import annotations

import sys
from typing import Any

from . import vm

__all__ = ["CudaMemory", "LocalMemory", "cuda_memory", "describe", "local_memory", "overlaps"]

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


class CudaMemory(LocalMemory):
    """A contiguous range of one GPU's memory: a CUDA tensor's bytes.

    ``stream`` is the tensor's current stream when it was described (the caller's
    ``read_into``/``write_from``): copies wait for it and it waits for them.
    """

    __slots__ = ("device", "stream", "tensor", "uuid")
    host = False

    def __init__(self, t: Any, nbytes: int, kind: str, stream: Any, uuid: str) -> None:
        super().__init__(int(t.data_ptr()), nbytes, False, t, kind)
        self.tensor = t
        self.device = int(t.device.index)
        self.stream = stream
        self.uuid = uuid

    def bytes_view(self, offset: int = 0, nbytes: int | None = None) -> Any:
        """The tensor's bytes ``offset..offset+nbytes`` as a 1-D uint8 CUDA tensor (no copy)."""
        n = self.nbytes - offset if nbytes is None else nbytes
        return _byte_tensor(self.tensor)[offset : offset + n]


def describe(t: Any) -> str:
    """``tensor((4, 8), torch.float32) on cuda:0``: what errors name a tensor by."""
    return f"tensor({tuple(t.shape)}, {t.dtype}) on {t.device}"


def cuda_memory(t: Any, role: str) -> CudaMemory:
    """Describe the CUDA tensor ``t`` (``role`` names it in errors); see ``memory.local_memory``.

    Raises ``ValueError`` for a non-contiguous or non-strided tensor, naming its
    device, dtype and size, and ``RuntimeError`` where CUDA cannot be used here.
    """
    torch = sys.modules["torch"]
    what = describe(t)
    if t.layout is not torch.strided:
        raise ValueError(
            f"{role} is a {what} with layout {t.layout}; pass a dense (strided) tensor, "
            "e.g. t.to_dense()"
        )
    if not t.is_contiguous():
        raise ValueError(
            f"{role} is a non-contiguous {what} (stride {tuple(t.stride())}, "
            f"{t.numel() * t.element_size()} bytes); pass t.contiguous() (a copy on the same "
            "GPU) or a contiguous view"
        )
    if not torch.cuda.is_available():  # pragma: no cover - a CUDA tensor implies CUDA
        raise RuntimeError(f"{role} is a {what} but CUDA is not available in this process")
    nbytes = t.numel() * t.element_size()
    kind = f"{what} of {nbytes} bytes"
    stream = torch.cuda.current_stream(t.device)
    return CudaMemory(t, nbytes, kind, stream, device_uuid(t.device.index))


def device_uuid(index: int) -> str:
    """The UUID of this process's CUDA device ``index`` (stable across processes)."""
    return str(sys.modules["torch"].cuda.get_device_properties(index).uuid)


def _byte_tensor(t: Any) -> Any:
    """``t``'s bytes as a 1-D uint8 tensor on its device, any dtype (bool, complex) allowed."""
    torch = sys.modules["torch"]
    out = torch.empty(0, dtype=torch.uint8, device=t.device)
    n = t.numel() * t.element_size()
    return out.set_(t.untyped_storage(), t.storage_offset() * t.element_size(), (n,))


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
