"""Message bodies: pickle protocol 5 with out-of-band buffers, cloudpickle for ``__main__``.

``dumps(obj)`` returns ``(body, buffers)``; large numpy arrays and CPU torch
tensors contribute their memory as buffers, which the transport writes
without copying. ``loads(body, buffers)`` rebuilds the object; arrays come
back as views of the received frame.

Plain data (``None``, bools, numbers, strings, bytes, and tuples, lists,
dicts and sets of them), with numpy arrays and CPU torch tensors among it,
takes a fast path: the C pickler with no cloudpickle machinery, through a
reused pickler (a small pool, no lock), or straight ``pickle.dumps`` for a few
atoms. A tensor pickles by ``_reduce_tensor``, as the general path does it;
an array by numpy's own protocol-5 reduction, its dtype named by its code
where that keeps it whole (``numpy._core.numeric._frombuffer`` takes either).
A bytes or bytearray of ``_BIG_BYTES`` or more, as the value or among a
call's arguments, travels out of band too (``_BigBytes``: rebuilt by
``bytes(buffer)``). Every stream decodes with the plain unpickler and no
danaus function it did not use before: no wire change. Anything else (a
class, a function, an array of objects, a tensor that needs grad ...) goes to
a fresh cloudpickle pickler, which pickles ``__main__`` by value.

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
        if type(obj) is _BigBytes:
            return obj.reduce()
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
    """The C pickler for plain data, arrays and tensors only: ``_NotPlain`` at anything else.

    The C pickler handles atoms itself and asks ``reducer_override`` about
    every other object (containers included), so this sees each container,
    array, tensor, dtype and global, and the first value that would need a
    reduction it does not know. Large buffers go out of band (``buffers``),
    by the same rule as the general path's.
    """

    def __init__(self) -> None:
        self.out = io.BytesIO()
        self.buffers: list[pickle.PickleBuffer] = []
        super().__init__(self.out, protocol=5, buffer_callback=self._out_of_band)

    def _out_of_band(self, buf: pickle.PickleBuffer) -> bool:
        buffers = self.buffers
        if len(buffers) >= MAX_OOB_BUFFERS or memoryview(buf).nbytes < _OOB_MIN:
            return True
        buffers.append(buf)
        return False

    def reducer_override(self, obj: object) -> Any:
        t = type(obj)
        if t in _CONTAINERS or t is pickle.PickleBuffer:
            return NotImplemented
        if t is _BigBytes:
            return obj.reduce()  # type: ignore[attr-defined]
        if id(obj) in _ARRAY_GLOBALS or t in _DTYPE_TYPES or obj is bytes or obj is bytearray:
            # numpy's ``_frombuffer`` and ``dtype`` (by reference), a dtype (its reduce),
            # what a `_BigBytes` rebuilds
            return NotImplemented
        if t in _ARRAY_TYPES or _learn_arrays(t):
            return _reduce_array(obj)
        raise _NotPlain

    def pickle(self, obj: object) -> tuple[bytes, list[pickle.PickleBuffer]]:
        out = self.out
        out.seek(0)
        out.truncate()
        try:
            self.dump(obj)
            return out.getvalue(), self.buffers
        finally:
            # Nothing of the value stays referenced by a pooled pickler (an array of
            # a GiB must not live on in its memo or buffer list).
            self.buffers = []
            self.clear_memo()


def _reduce_array(obj: Any) -> Any:
    """The fast pickler's reduction of a numpy array or a torch tensor (``_ARRAY_TYPES``):
    for a contiguous array of plain values numpy's own protocol-5 reduction (one
    out-of-band buffer) with the dtype's code in place of the dtype object, or that
    reduction itself (NotImplemented) where the code would lose something; for a CPU
    tensor ``_reduce_tensor``'s; else ``_NotPlain`` (the general path decides)."""
    torch = sys.modules.get("torch")
    if torch is not None and type(obj) is torch.Tensor:
        r = _reduce_tensor(obj)
        if r is NotImplemented:
            raise _NotPlain
        return r
    # numpy reduces a non-contiguous array to a copy in band, through a global this
    # pickler does not know (``_NotPlain`` then): only contiguous ones get here.
    dtype = obj.dtype
    if dtype.hasobject:
        raise _NotPlain
    flags = obj.flags
    c = flags.c_contiguous
    if not (c or flags.f_contiguous):
        raise _NotPlain
    # (Metadata first: dtypes that differ only in it are equal, one key of the cache.)
    code = _DTYPE_CODES.get(dtype) if dtype.metadata is None else ""
    if code is None:
        code = _DTYPE_CODES[dtype] = _dtype_code(dtype)
    if not code:
        return NotImplemented  # numpy's own reduction, the dtype pickled as an object
    # What numpy's own protocol-5 reduction returns, with the dtype named by its code:
    # pickling the dtype object (its class, its state) costs ten times the rest.
    # (An F-ordered array's buffer is its transpose's, C-ordered, as numpy does it.)
    buf = pickle.PickleBuffer(obj if c else obj.T)
    return _FROMBUFFER[0], (buf, code, obj.shape, "C" if c else "F")


_DTYPE_CODES: dict[Any, str] = {}  # numpy dtype -> its code, or "" where that loses something
_FROMBUFFER: list[Any] = []  # numpy's ``_frombuffer`` (what its arrays reduce to)


def _dtype_code(dtype: Any) -> str:
    """``dtype.str`` when ``numpy.dtype`` of it gives ``dtype`` back whole (no fields,
    no subarray, no metadata), else ""."""
    if dtype.names is not None or dtype.subdtype is not None or dtype.metadata is not None:
        return ""
    np = sys.modules["numpy"]
    code: str = dtype.str
    try:
        return code if np.dtype(code) == dtype else ""
    except TypeError:
        return ""


# Filled by ``_learn_arrays`` once numpy or torch has been imported (by the program):
# the array and tensor types, numpy's dtype types, and the ids of the globals numpy's
# reductions name (``_frombuffer``, ``dtype``) and of ``_rebuild_tensor``.
_ARRAY_TYPES: set[type] = set()
_DTYPE_TYPES: set[type] = set()
_ARRAY_GLOBALS: set[int] = set()
_ARRAY_NAMES = frozenset({("numpy", "ndarray"), ("torch", "Tensor")})


def _learn_arrays(t: type) -> bool:
    """Whether ``t``, a top-level value's type, is numpy's array or torch's tensor; the
    first time, learn what the fast pickler needs of them."""
    if t in _ARRAY_TYPES:
        return True
    if (t.__module__, t.__qualname__) not in _ARRAY_NAMES:
        return False
    np = sys.modules.get("numpy")
    if np is not None and t is np.ndarray:
        frombuffer = np.empty(_OOB_MIN, np.uint8).__reduce_ex__(5)[0]
        _FROMBUFFER[:] = [frombuffer]
        dtype_cls = np.dtype("u1").__reduce__()[0]
        _ARRAY_GLOBALS.update((id(frombuffer), id(dtype_cls)))
        _DTYPE_TYPES.update(type(np.dtype(c)) for c in np.typecodes["All"])
        _DTYPE_TYPES.add(np.dtype)
        _ARRAY_TYPES.add(t)
        return True
    torch = sys.modules.get("torch")
    if torch is not None and t is torch.Tensor:
        _ARRAY_GLOBALS.add(id(_rebuild_tensor))
        _ARRAY_TYPES.add(t)
        return True
    return False


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
            if t is bytes and len(x) >= _BIG_BYTES:
                return False
            continue
        if t is tuple and len(x) <= _SMALL:
            for y in x:
                u = type(y)
                if u not in _ATOMS or (u is bytes and len(y) >= _BIG_BYTES):
                    return False
            continue
        if t is dict and not x:
            continue
        return False
    return True


def dumps(obj: object) -> tuple[bytes, list[pickle.PickleBuffer]]:
    """Pickle ``obj``; returns the in-band stream and the out-of-band buffers."""
    t = type(obj)
    # t is type(obj), which mypy does not narrow through (one type() call saved per message)
    if (t in _ATOMS and (t is not bytes or len(obj) < _BIG_BYTES)) or (  # type: ignore[arg-type]
        t is tuple and small_plain(obj)
    ):
        return pickle.dumps(obj, protocol=5), []
    if _has_big_bytes(obj):
        obj = _lift_bytes(obj, 2, {})
        t = type(obj)
    if t in _CONTAINERS or t in _ARRAY_TYPES or t is _BigBytes or _learn_arrays(t):
        try:
            p = _POOL.pop()
        except IndexError:
            p = _PlainPickler()
        try:
            return p.pickle(obj)
        except Exception:  # not plain data (or not picklable): the general path decides
            pass
        finally:
            if len(_POOL) < 8:
                _POOL.append(p)
    return _dumps_general(obj)


_BIG_BYTES = 64 << 10  # bytes and bytearrays at least this long travel out of band
_LIFT_MAX = 64  # containers longer than this are not searched for them


class _BigBytes:
    """A ``bytes`` or ``bytearray`` of at least ``_BIG_BYTES`` in a value being pickled:
    the picklers reduce it to ``type(b)(PickleBuffer(b))``, an out-of-band buffer
    written straight from ``b`` (the C pickler writes bytes in band, a copy into the
    stream), rebuilt by one copy on the receiver, as an in-band one would be."""

    __slots__ = ("b",)

    def __init__(self, b: bytes | bytearray) -> None:
        self.b = b

    def reduce(self) -> Any:
        return type(self.b), (pickle.PickleBuffer(self.b),)


def _has_big_bytes(obj: Any) -> bool:
    """Whether `_lift_bytes` (``depth`` 2) would find a large bytes or bytearray in
    ``obj`` (a quick look, nothing built)."""
    t = type(obj)
    if t is bytes or t is bytearray:
        return len(obj) >= _BIG_BYTES
    if t not in _LIFTED or len(obj) > _LIFT_MAX:
        return False
    for x in obj.values() if t is dict else obj:
        u = type(x)
        if u is bytes or u is bytearray:
            if len(x) >= _BIG_BYTES:
                return True
        elif u in _LIFTED and len(x) <= _LIFT_MAX:
            for y in x.values() if u is dict else x:
                v = type(y)
                if (v is bytes or v is bytearray) and len(y) >= _BIG_BYTES:
                    return True
    return False


def _lift_bytes(obj: Any, depth: int, seen: dict[int, Any]) -> Any:
    """``obj`` with each large bytes or bytearray in it, itself or ``depth`` containers
    deep at most (a call's ``(args, kwargs)``: its arguments), replaced by a `_BigBytes`
    (one per object: ``seen``, so a bytearray passed twice arrives as one); ``obj``
    itself, not a copy, if it holds none."""
    t = type(obj)
    if t is bytes or t is bytearray:
        if len(obj) < _BIG_BYTES:
            return obj
        big = seen.get(id(obj))
        if big is None:
            big = seen[id(obj)] = _BigBytes(obj)
        return big
    if not depth or t not in _LIFTED or len(obj) > _LIFT_MAX:
        return obj
    if t is dict:
        vals = [_lift_bytes(v, depth - 1, seen) for v in obj.values()]
        if all(a is b for a, b in zip(vals, obj.values(), strict=True)):
            return obj
        return dict(zip(obj, vals, strict=True))
    items = [_lift_bytes(x, depth - 1, seen) for x in obj]
    if all(a is b for a, b in zip(items, obj, strict=True)):
        return obj
    return t(items)


_LIFTED = frozenset({tuple, list, dict})


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
