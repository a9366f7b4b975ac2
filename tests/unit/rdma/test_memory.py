"""Local memory descriptions: addresses without copies, and clear refusals."""

from __future__ import annotations

import array
import ctypes
import mmap

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from danaus._rdma.memory import LocalMemory, local_memory, overlaps


def test_a_numpy_array_is_described_by_its_own_address_and_size() -> None:
    a = np.arange(1000, dtype=np.int32)
    mem = local_memory(a, "dst")
    assert (mem.addr, mem.nbytes, mem.readonly) == (a.ctypes.data, 4000, False)


def test_a_bytearray_is_held_exported_so_it_cannot_move() -> None:
    b = bytearray(b"abcdef")
    mem = local_memory(b, "dst")
    assert ctypes.string_at(mem.addr, mem.nbytes) == b"abcdef"
    with pytest.raises(BufferError):
        b.extend(b"more")  # resizing would move the memory under a registration
    del mem


def test_read_only_memory_is_described_as_read_only() -> None:
    data = b"immutable bytes"
    mem = local_memory(data, "src")
    assert mem.readonly
    assert ctypes.string_at(mem.addr, mem.nbytes) == data
    frozen = np.frombuffer(b"xyz", dtype=np.uint8)
    assert local_memory(frozen, "src").readonly


def test_other_buffer_objects_work_too() -> None:
    arr = array.array("d", [1.5, 2.5])
    assert local_memory(arr, "src").nbytes == 16
    with mmap.mmap(-1, 4096) as m:
        mem = local_memory(m, "src")
        assert mem.nbytes == 4096
        del mem
    view = memoryview(bytearray(100))[10:20]
    mem = local_memory(view, "dst")
    assert mem.nbytes == 10
    assert mem.addr == local_memory(view.obj, "x").addr + 10


def test_a_c_contiguous_multi_dimensional_array_is_its_raw_bytes() -> None:
    a = np.arange(12, dtype=np.int64).reshape(3, 4)
    assert local_memory(a, "src").nbytes == 96
    assert local_memory(a[1], "src").addr == a.ctypes.data + 32


def test_non_contiguous_memory_is_refused_with_what_to_pass_instead() -> None:
    a = np.arange(12).reshape(3, 4)[:, :2]
    with pytest.raises(ValueError, match=r"non-contiguous.*np\.ascontiguousarray"):
        local_memory(a, "dst")
    with pytest.raises(ValueError, match="non-contiguous"):
        local_memory(memoryview(bytearray(10))[::2], "dst")


def test_empty_memory_is_refused_where_a_buffer_needs_bytes() -> None:
    assert local_memory(bytearray(), "src").nbytes == 0
    with pytest.raises(ValueError, match="empty"):
        local_memory(bytearray(), "data", allow_empty=False)


def test_objects_without_memory_are_a_type_error() -> None:
    for bad in (3, "text", [1, 2], None):
        with pytest.raises(TypeError, match="must be"):
            local_memory(bad, "dst")


def test_tensors_are_described_by_data_ptr_including_their_offset() -> None:
    torch = pytest.importorskip("torch")
    t = torch.arange(100, dtype=torch.float64)
    mem = local_memory(t, "src")
    assert (mem.addr, mem.nbytes) == (t.data_ptr(), 800)
    view = t[10:20]
    assert local_memory(view, "src").addr == t.data_ptr() + 80
    m2 = torch.zeros(4, 5)
    assert local_memory(m2, "src").nbytes == 80  # any contiguous shape


def test_unusable_tensors_are_refused_clearly() -> None:
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match=r"non-contiguous tensor.*contiguous\(\)"):
        local_memory(torch.zeros(4, 4).t(), "dst")
    with pytest.raises(NotImplementedError, match="device 'meta'"):
        local_memory(torch.zeros(4, device="meta"), "dst")
    with pytest.raises(ValueError, match="layout"):
        local_memory(torch.zeros(4, 4).to_sparse(), "dst")
    with pytest.raises(ValueError, match="empty"):
        local_memory(torch.zeros(0), "data", allow_empty=False)


@given(
    a=st.tuples(st.integers(0, 100), st.integers(0, 50)),
    b=st.tuples(st.integers(0, 100), st.integers(0, 50)),
)
def test_overlaps_means_sharing_at_least_one_byte(a: tuple[int, int], b: tuple[int, int]) -> None:
    ma = LocalMemory(a[0], a[1], False, None, "x")
    mb = LocalMemory(b[0], b[1], False, None, "y")
    shared = set(range(a[0], a[0] + a[1])) & set(range(b[0], b[0] + b[1]))
    assert overlaps(ma, mb) == overlaps(mb, ma) == bool(shared)
