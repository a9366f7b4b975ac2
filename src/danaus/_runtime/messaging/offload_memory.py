"""What a sender holds for a frame offloaded to a peer on this host: the shared slots a
receiver maps (memfd mappings kept warm for reuse), the private snapshots it copies
from, and ``own``, the copy of a large buffer made without holding the GIL throughout.
The offload protocol that uses them is ``offload``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sized
from typing import TYPE_CHECKING, Any, NamedTuple

from ..._transport import vm
from ..._wire import memory
from ..._wire.frame import alloc, flat

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

__all__ = ["Held", "Slot", "copy_into", "own"]


def size_of(copies: Iterable[Sized]) -> int:
    return sum(len(c) for c in copies)


def bucket(n: int) -> int:
    return 1 << max(20, (n - 1).bit_length())  # powers of two from 1 MiB


class Held(NamedTuple):
    """What a sender holds for an offloaded frame until the receiver releases it."""

    peer: str
    copies: list[Any]  # private snapshots (back to the pool on release)
    size: int  # bytes the receiver reads
    on_left: Callable[[], None] | None  # told once the receiver has read (or is lost)
    lent: list[Any]  # the caller's own buffers, read in place (not copied)


class Slot:
    """A shared snapshot mapping (memfd) a receiver on this host can map."""

    __slots__ = ("fd", "map", "size", "uid")

    def __init__(self, fd: int, size: int, uid: int) -> None:
        self.fd, self.size, self.uid = fd, size, uid
        try:
            self.map = memory.shared(fd, size)  # faulted in without holding the GIL
        except BaseException:
            os.close(fd)
            raise

    def close(self) -> bool:
        """Unmap and close it, once; False (nothing done yet) while a sender thread still
        copies into it (a view of it is exported): that thread closes it after."""
        if self.fd < 0:
            return True
        try:
            self.map.close()
        except BufferError:
            return False
        os.close(self.fd)
        self.fd = -1  # closing twice would close whatever file reuses the number
        return True


def copy_into(dst: memoryview, src: ReadableBuffer) -> None:
    """``dst[:] = src`` for large buffers, in chunks with the GIL released: a sender
    thread copying a GiB must not keep the I/O thread from answering heartbeats (it
    did, for over 5 s on a loaded host, and the proc was declared frozen)."""
    vm.memmove(vm.address(dst), vm.address(memoryview(src).cast("B")), len(dst))


def own(part: ReadableBuffer) -> bytes | memoryview:
    """A private copy of the byte-like ``part`` (a frame part kept to send later);
    a large one is copied as ``copy_into`` does, without holding the GIL throughout."""
    view = flat(part)
    if len(view) < memory.SMALL:
        return bytes(view)
    copy = memoryview(alloc(len(view)))
    copy_into(copy, view)
    return copy
