"""Large mappings made without holding the GIL.

``mmap.mmap(..., flags=MAP_POPULATE)`` faults every page in inside the
``mmap`` call, and CPython up to 3.11 holds the GIL through it: 0.5 s for
1 GiB on an idle virtual machine, longer on a loaded one, during which the
process's I/O thread can send no heartbeat (its peers then declare it frozen
and give it up). Here a large mapping is made unpopulated (quick) and its
pages are faulted in by ``madvise(MADV_POPULATE_WRITE)`` (Linux 5.14+)
through ctypes, which releases the GIL for the call. Where that is not
available the pages are left to fault in when first written: by a socket
read or a chunked ``memmove``, both of which release the GIL too.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import mmap
import sys
import threading
from collections.abc import Callable
from typing import Any

from .. import _config as config

__all__ = ["Budget", "anonymous", "populate", "shared", "staging", "supported"]

_POPULATE = getattr(mmap, "MAP_POPULATE", 0)
_MADV_POPULATE_WRITE = 23  # linux/mman.h, since 5.14
#: Below this the kernel populates inside ``mmap`` (a few ms at most with the GIL).
SMALL = 8 << 20


@functools.lru_cache(maxsize=1)
def _madvise() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise  # this process's libc
    except (OSError, AttributeError):  # pragma: no cover - a Linux without a usable libc
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


# Per process, not a node part: MADV_POPULATE_WRITE refused once (an older kernel): the
# kernel's answer does not change, so it is not asked again.
_unsupported = False


def populate(mapping: mmap.mmap) -> bool:
    """Fault every page of the writable ``mapping`` in, the GIL released; whether it
    was done (False: the pages fault in when first written)."""
    global _unsupported
    madvise = _madvise()
    if madvise is None or _unsupported or len(mapping) == 0:
        return False
    anchor = ctypes.c_char.from_buffer(mapping)  # an export: the mapping stays put
    try:
        if madvise(ctypes.addressof(anchor), len(mapping), _MADV_POPULATE_WRITE) == 0:
            return True
    finally:
        del anchor
    if ctypes.get_errno() == errno.EINVAL:  # this kernel has no MADV_POPULATE_WRITE
        _unsupported = True
    return False  # ENOMEM and the like: the pages fault in on use (or fail there)


def supported() -> bool:
    """Whether this system faults pages in without the GIL (a one-page probe)."""
    if _madvise() is None:
        return False
    probe = mmap.mmap(-1, mmap.PAGESIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        return populate(probe)
    finally:
        probe.close()


def anonymous(n: int) -> mmap.mmap:
    """A private anonymous mapping of ``n`` bytes, its pages faulted in."""
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    if n < SMALL:
        return mmap.mmap(-1, n, flags=flags | _POPULATE)
    mapping = mmap.mmap(-1, n, flags=flags)
    populate(mapping)
    return mapping


def shared(fd: int, n: int) -> mmap.mmap:
    """A shared mapping of the first ``n`` bytes of file ``fd``, its pages faulted in."""
    if n < SMALL:
        return mmap.mmap(fd, n, flags=mmap.MAP_SHARED | _POPULATE)
    mapping = mmap.mmap(fd, n, flags=mmap.MAP_SHARED)
    populate(mapping)
    return mapping


class Budget:
    """Bytes of staging memory (snapshots of large messages) held at once, within a
    limit read on each ``try_take``. Thread-safe; never blocks: a sender that finds no
    room sends without a snapshot and waits until its bytes have left instead.
    """

    def __init__(self, limit: Callable[[], int]) -> None:
        self._limit = limit
        self._lock = threading.Lock()  # guards used and peak
        self.used = 0
        self.peak = 0  # the most ever held at once (a statistic, for tests)

    def try_take(self, n: int) -> bool:
        """Take ``n`` bytes if they fit within the limit; whether they were taken."""
        with self._lock:
            if self.used + n > self._limit():
                return False
            self.used += n
            self.peak = max(self.peak, self.used)
            return True

    def take(self, n: int) -> None:
        """Take ``n`` bytes even beyond the limit (a thread that must not wait)."""
        with self._lock:
            self.used += n
            self.peak = max(self.peak, self.used)

    def give(self, n: int) -> None:
        """Give back ``n`` bytes taken before."""
        with self._lock:
            self.used -= n


#: This process's staging memory: snapshots of large messages not yet sent or read.
staging = Budget(lambda: int(config.get("staging_max")))
