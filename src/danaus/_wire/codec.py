"""Message bodies: pickle protocol 5 with out-of-band buffers, cloudpickle for ``__main__``.

``dumps(obj)`` returns ``(body, buffers)``; large numpy arrays and CPU torch
tensors contribute their memory as buffers, which the transport writes
without copying. ``loads(body, buffers)`` rebuilds the object; arrays come
back as views of the received frame.

Plain data (``None``, bools, numbers, strings, bytes, and tuples, lists,
dicts and sets of them) takes a fast path: the C pickler with no
cloudpickle machinery, through a reused pickler (a small pool, no lock), or
straight ``pickle.dumps`` for a few atoms. The stream is the same pickle
either way; anything else (a class, a function, an array, a tensor ...)
goes to a fresh cloudpickle pickler, which pickles ``__main__`` by value.

Torch is never imported here: tensors are recognised only when the sender
has already imported torch.
"""

from __future__ import annotations

import io
import pickle
import sys
import types
from typing import TYPE_CHECKING, Any

import cloudpickle

if TYPE_CHECKING:
    import torch

__all__ = ["dumps", "dumps_checked", "loads", "small_plain"]

_OOB_MIN = 4096  # buffers smaller than this are pickled in band
MAX_OOB_BUFFERS = 1024  # well under the frame decoder's limit (MAX_BUFFERS)


def _rebuild_tensor(
    buf: bytes | bytearray | memoryview, dtype_name: str, shape: tuple[int, ...], view_dtype: str
) -> torch.Tensor:
    # torch and numpy are optional (the ``torch`` extra): only a pickled tensor gets here.
    import numpy as np
    import torch

    arr = np.frombuffer(buf, dtype=np.dtype(dtype_name)).reshape(shape)
    t = torch.from_numpy(arr)
    if view_dtype:
        t = t.view(getattr(torch, view_dtype))
    return t


_NUMPY_UNSUPPORTED = {"bfloat16": "int16", "float8_e4m3fn": "uint8", "float8_e5m2": "uint8"}


def _reduce_tensor(t: torch.Tensor) -> Any:
    """Reduce a CPU tensor to a zero-copy out-of-band buffer, or NotImplemented."""
    torch = sys.modules["torch"]
    if (
        type(t) is not torch.Tensor
        or t.device.type != "cpu"
        or t.requires_grad
        or t.is_sparse
        or t.is_quantized
        or t.nbytes < _OOB_MIN
        or not t.is_contiguous()
    ):
        return NotImplemented
    dtype = str(t.dtype).removeprefix("torch.")
    view_dtype = ""
    if dtype in _NUMPY_UNSUPPORTED:
        view_dtype = dtype
        t = t.view(getattr(torch, _NUMPY_UNSUPPORTED[dtype]))
    try:
        arr = t.numpy()
    except (TypeError, RuntimeError):
        return NotImplemented
    # numpy's stubs give ndarray its __buffer__ only from Python 3.12 (PEP 688); it has one.
    buf = pickle.PickleBuffer(arr)  # type: ignore[arg-type]
    return _rebuild_tensor, (buf, arr.dtype.str, tuple(arr.shape), view_dtype)


def _reduce_code(obj: types.CodeType) -> Any:
    """cloudpickle's code reduction, keeping the file name so remote tracebacks show it."""
    fn, args = cloudpickle.cloudpickle._code_reduce(obj)
    args = tuple(obj.co_filename if a == "<dynamic-code>" else a for a in args)
    return fn, args


class _Pickler(cloudpickle.Pickler):  # type: ignore[misc]
    def reducer_override(self, obj: object) -> Any:
        if type(obj) is types.CodeType:
            return _reduce_code(obj)
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(obj, torch.Tensor):
            r = _reduce_tensor(obj)
            if r is not NotImplemented:
                return r
        return super().reducer_override(obj)


class _NotPlain(Exception):
    """Raised by the plain pickler at the first value that is not plain data."""


_ATOMS = frozenset({int, float, str, bytes, bool, type(None)})
_CONTAINERS = frozenset({tuple, list, dict, set, frozenset})
_SMALL = 8  # a tuple of up to this many atoms (or empty containers) skips the pickler pool


class _PlainPickler(pickle.Pickler):
    """The C pickler for plain data only: ``_NotPlain`` at anything else.

    The C pickler handles atoms itself and asks ``reducer_override`` about
    every other object (containers included), so this sees each container
    and the first value that would need a reduction.
    """

    def __init__(self) -> None:
        self.out = io.BytesIO()
        super().__init__(self.out, protocol=5)

    def reducer_override(self, obj: object) -> Any:
        if type(obj) in _CONTAINERS:
            return NotImplemented
        raise _NotPlain

    def pickle(self, obj: object) -> bytes:
        out = self.out
        out.seek(0)
        out.truncate()
        self.clear_memo()
        self.dump(obj)
        return out.getvalue()


# A per-process cache, not state: idle plain picklers; list pop/append are atomic.
_POOL: list[_PlainPickler] = []


def small_plain(obj: object) -> bool:
    """True if ``obj`` is a short tuple of atoms and small atom-only tuples and empty
    dicts (e.g. a call's ``(args, {})``): pickled by ``pickle.dumps``, no reduction runs."""
    if type(obj) is not tuple or len(obj) > _SMALL:
        return False
    for x in obj:
        t = type(x)
        if t in _ATOMS:
            continue
        if t is tuple and len(x) <= _SMALL:
            for y in x:
                if type(y) not in _ATOMS:
                    return False
            continue
        if t is dict and not x:
            continue
        return False
    return True


def dumps(obj: object) -> tuple[bytes, list[pickle.PickleBuffer]]:
    """Pickle ``obj``; returns the in-band stream and the out-of-band buffers."""
    t = type(obj)
    if t in _ATOMS or (t is tuple and small_plain(obj)):
        return pickle.dumps(obj, protocol=5), []
    if t in _CONTAINERS:
        try:
            p = _POOL.pop()
        except IndexError:
            p = _PlainPickler()
        try:
            return p.pickle(obj), []
        except Exception:  # not plain data (or not picklable): the general path decides
            pass
        finally:
            if len(_POOL) < 8:
                _POOL.append(p)
    return _dumps_general(obj)


def _dumps_general(obj: object) -> tuple[bytes, list[pickle.PickleBuffer]]:
    """cloudpickle, with out-of-band buffers and danaus's reductions."""
    buffers: list[pickle.PickleBuffer] = []

    def out_of_band(buf: pickle.PickleBuffer) -> bool:
        # Small buffers, and any beyond the frame's buffer limit, go in band (True):
        # a list of 10,000 tiny arrays must not make an undecodable frame.
        if len(buffers) >= MAX_OOB_BUFFERS or memoryview(buf).nbytes < _OOB_MIN:
            return True
        buffers.append(buf)
        return False

    f = io.BytesIO()
    _Pickler(f, protocol=5, buffer_callback=out_of_band).dump(obj)
    return f.getvalue(), buffers


def dumps_checked(obj: object, what: str) -> tuple[bytes, list[pickle.PickleBuffer]]:
    """``dumps`` whose failure raises ``TypeError`` naming ``what`` could not be pickled."""
    try:
        return dumps(obj)
    except Exception as e:
        raise TypeError(
            f"{what} cannot be pickled: {type(e).__name__}: {e}. Only picklable values can be "
            "sent to actors; pass something picklable instead (or define __reduce__)."
        ) from e


def loads(body: bytes | memoryview, buffers: list[Any] | tuple[Any, ...] = ()) -> Any:
    """Unpickle a body produced by `dumps()`.

    Replies are unpickled on the thread that reads them, which may have torch
    dispatch modes on (an active mesh of the tensor engine): they must not
    turn the tensors the sender sent into the mesh's, so they are off meanwhile.
    """
    torch = sys.modules.get("torch")
    if torch is not None and torch._C._len_torch_dispatch_stack() > 0:
        from torch.utils._python_dispatch import _disable_current_modes  # optional: torch

        with _disable_current_modes():
            return pickle.loads(body, buffers=buffers)
    return pickle.loads(body, buffers=buffers)
