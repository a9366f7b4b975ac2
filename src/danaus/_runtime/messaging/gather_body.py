"""The body of a GATHER frame: a subtree's replies, as one restricted pickle.

Replies with large buffers travel as they came (their buffers out of band), plain
values of the subtree as one pickled list; `decode_entries()` refuses any class.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..._wire import codec
from ..._wire.frame import MAX_BUFFERS, flat
from ..._wire.protocol import STATUS_OK

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

__all__ = ["Entry", "decode_entries", "encode_entries"]

_OOB_MIN = 64 << 10  # reply buffers at least this large travel out of band in a GATHER

Entry = tuple[int, int, Any, Sequence[Any]]  # (slot, status, body, buffers)


class _NoClasses(pickle.Unpickler):
    """GATHER bodies hold only tuples, ints, bytes and buffers: refuse any class."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"a GATHER body may not name {module}.{name}")


def encode_entries(
    entries: Sequence[Entry], slots: Sequence[int] = (), values: Sequence[Any] = ()
) -> tuple[bytes, list[Any]]:
    """``(body, buffers)`` of a GATHER: ``entries`` as they came (large reply buffers out
    of band), and the plain ``values`` of ``slots`` as one pickled list."""
    vbody = b""
    if slots:
        vbody, vbufs = codec.dumps(list(values))
        if vbufs:  # pickled anew, some value grew buffers: send each as it would come
            entries = [*entries, *(_plain(s, v) for s, v in zip(slots, values, strict=True))]
            slots, vbody = (), b""
    oob: list[Any] = []
    big = sum(1 for e in entries for b in e[3] if len(flat(b)) >= _OOB_MIN)
    wrap = big <= MAX_BUFFERS - 1

    def buf(b: ReadableBuffer) -> pickle.PickleBuffer | bytes:
        raw = flat(b)
        if wrap and len(raw) >= _OOB_MIN:
            return pickle.PickleBuffer(raw)
        return bytes(raw)

    items = [
        (s, st, bytes(flat(body)), tuple(buf(b) for b in bufs)) for s, st, body, bufs in entries
    ]
    body = pickle.dumps((items, tuple(slots), vbody), protocol=5, buffer_callback=oob.append)
    return body, [b.raw() for b in oob]


def _plain(slot: int, value: object) -> Entry:
    body, bufs = codec.dumps(value)
    return (slot, STATUS_OK, body, [bytes(flat(b)) for b in bufs])


def decode_entries(
    body: ReadableBuffer, buffers: Sequence[ReadableBuffer]
) -> tuple[list[Entry], tuple[int, ...], list[Any]]:
    """``(entries, slots, values)`` of a GATHER body; raises on anything else."""
    items, slots, vbody = _NoClasses(io.BytesIO(body), buffers=buffers).load()
    if not isinstance(items, list) or not isinstance(slots, tuple):
        raise ValueError("a GATHER body is not (entries, slots, values)")
    values = codec.loads(vbody) if slots else []
    if len(values) != len(slots):
        raise ValueError(f"a GATHER with {len(slots)} slots and {len(values)} values")
    return items, slots, values
