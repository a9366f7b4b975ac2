"""Large mappings are faulted in with the GIL released (``danaus._wire.memory``).

``mmap(MAP_POPULATE)`` of 1 GiB held the GIL for seconds on a loaded machine: the
process's I/O thread sent no heartbeat and its peers gave it up (the 1 GiB
transfer tests' failures in CI). Here another thread watches the populating
thread's stack: it can only look while that thread is inside ``madvise`` if the
GIL was released for the call.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys
import threading
import time

import pytest

from danaus._runtime.messaging.offload import own
from danaus._transport import vm
from danaus._wire import memory
from danaus._wire.frame import alloc

MiB = 1 << 20
BIG = 256 * MiB

needs_populate = pytest.mark.skipif(
    not memory.supported(), reason="needs MADV_POPULATE_WRITE (Linux 5.14 or later)"
)


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _seen_inside(make: object, function: object = memory.populate) -> bool:
    """Call ``make()`` here; whether another thread ran Python while this one was
    inside ``function`` (so the GIL was free during its system call).

    The switch interval is raised to 10 s meanwhile: this thread then gives the GIL
    up only where it releases it itself (the watcher yields it back at every
    sample), never because the interpreter asked it to take turns.
    """
    me = threading.get_ident()
    code = function.__code__  # type: ignore[attr-defined]
    done = threading.Event()
    seen: list[bool] = []

    def watch() -> None:
        while not done.is_set():
            frame = sys._current_frames().get(me)
            if frame is not None and frame.f_code is code:
                seen.append(True)
                return
            time.sleep(1e-4)  # hands the GIL back

    interval = sys.getswitchinterval()
    sys.setswitchinterval(10.0)
    watcher = threading.Thread(target=watch)
    try:
        watcher.start()
        make()  # type: ignore[operator]
    finally:
        done.set()
        watcher.join()
        sys.setswitchinterval(interval)
    return bool(seen)


@needs_populate
def test_a_large_anonymous_mapping_is_faulted_in_while_other_threads_run() -> None:
    before = _rss()
    box: list[object] = []
    assert _seen_inside(lambda: box.append(alloc(BIG)))
    assert _rss() - before >= BIG * 9 // 10  # faulted in, not left to the first write
    mapping = box[0]
    view = memoryview(mapping)  # type: ignore[arg-type]
    assert len(view) >= BIG and view[0] == 0 and view[-1] == 0
    view[-1] = 7
    assert view[-1] == 7


@needs_populate
def test_a_large_shared_file_mapping_is_faulted_in_while_other_threads_run() -> None:
    fd = os.memfd_create("danaus-test")
    try:
        os.ftruncate(fd, BIG)
        box: list[object] = []
        assert _seen_inside(lambda: box.append(memory.shared(fd, BIG)))
        mapping = box[0]
        mapping[BIG - 1] = 5  # type: ignore[index]
        assert os.pread(fd, 1, BIG - 1) == b"\x05"  # shared: the file sees the write
    finally:
        os.close(fd)


def test_a_large_frame_part_kept_to_send_later_is_copied_while_other_threads_run() -> None:
    src = bytearray(BIG)
    src[0], src[-1] = 1, 2
    box: list[object] = []
    assert _seen_inside(lambda: box.append(own(memoryview(src))), vm.memmove)
    copy = box[0]
    assert bytes(copy[:1]) == b"\x01" and bytes(copy[-1:]) == b"\x02"  # type: ignore[index]
    src[0] = 9
    assert bytes(copy[:1]) == b"\x01"  # a copy, not a view of the caller's buffer
    assert own(b"small") == b"small" and isinstance(own(bytearray(b"ab")), bytes)


def test_a_kernel_without_populate_write_is_asked_once_and_pages_fault_in_on_use(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A kernel before 5.14 answers EINVAL: not asked again, the mapping still works."""
    calls: list[int] = []

    def refusing(addr: int, length: int, advice: int) -> int:
        calls.append(advice)
        ctypes.set_errno(errno.EINVAL)
        return -1

    monkeypatch.setattr(memory, "_madvise", lambda: refusing)
    monkeypatch.setattr(memory, "_unsupported", False)
    mapping = memory.anonymous(memory.SMALL * 2)
    assert calls == [memory._MADV_POPULATE_WRITE] and memory._unsupported is True
    assert memory.populate(memory.anonymous(memory.SMALL * 2)) is False
    assert calls == [memory._MADV_POPULATE_WRITE]  # not asked again
    mapping[-1] = 3
    assert mapping[-1] == 3
