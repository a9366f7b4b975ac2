"""The one-sided copy against a real second process (a plain Python child, not a proc)."""

from __future__ import annotations

import errno
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import numpy as np
import pytest

from danaus._rdma import vm

pytestmark = pytest.mark.skipif(not vm.available(), reason="needs process_vm_readv (Linux)")

_CHILD = textwrap.dedent(
    """
    import ctypes, sys
    n = int(sys.argv[1])
    data = bytearray((i * 7 + 3) % 251 + 1 for i in range(n))
    addr = ctypes.addressof(ctypes.c_char.from_buffer(data))
    print(addr, flush=True)
    for line in sys.stdin:  # "dump" prints the memory as hex; EOF ends the child
        print(bytes(data).hex(), flush=True)
    """
)


class Child:
    def __init__(self, n: int) -> None:
        self.n = n
        self.p = subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(n)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.p.stdout is not None
        self.addr = int(self.p.stdout.readline())
        self.pid = self.p.pid

    def expected(self) -> bytes:
        return bytes((i * 7 + 3) % 251 + 1 for i in range(self.n))

    def dump(self) -> bytes:
        assert self.p.stdin is not None and self.p.stdout is not None
        self.p.stdin.write("dump\n")
        self.p.stdin.flush()
        return bytes.fromhex(self.p.stdout.readline().strip())

    def close(self) -> None:
        if self.p.stdin is not None:
            self.p.stdin.close()
        self.p.wait(timeout=10)
        if self.p.stdout is not None:
            self.p.stdout.close()


@pytest.fixture
def child() -> Iterator[Child]:
    c = Child(100_000)
    yield c
    c.close()


def test_reads_another_processes_memory_in_chunks_and_parts(child: Child) -> None:
    dst = np.zeros(child.n, np.uint8)
    assert vm.copy(child.pid, dst.ctypes.data, child.addr, child.n, write=False, chunk=4096 + 17)
    assert dst.tobytes() == child.expected()


def test_writes_into_another_processes_memory(child: Child) -> None:
    src = np.random.default_rng(0).integers(1, 256, 5000, dtype=np.uint8)
    assert vm.copy(child.pid, src.ctypes.data, child.addr + 100, 5000, write=True, chunk=999)
    got = child.dump()
    assert got[100:5100] == src.tobytes()
    assert got[:100] == child.expected()[:100]
    assert got[5100:] == child.expected()[5100:]


def test_stop_ends_a_copy_between_chunks(child: Child) -> None:
    dst = np.zeros(child.n, np.uint8)
    calls = []

    def stop() -> bool:
        calls.append(1)
        return len(calls) > 2

    assert not vm.copy(child.pid, dst.ctypes.data, child.addr, child.n, write=False, chunk=1000,
                       stop=stop)  # fmt: skip
    assert dst[:2000].tobytes() == child.expected()[:2000]
    assert not dst[2000:].any()


def test_an_unmapped_remote_address_is_efault(child: Child) -> None:
    dst = np.zeros(10, np.uint8)
    with pytest.raises(OSError) as info:
        vm.copy(child.pid, dst.ctypes.data, 4096, 10, write=False)
    assert info.value.errno == errno.EFAULT


def test_a_process_that_exited_is_esrch() -> None:
    c = Child(10)
    c.close()  # exited and reaped
    dst = np.zeros(10, np.uint8)
    with pytest.raises(OSError) as info:
        vm.copy(c.pid, dst.ctypes.data, c.addr, 10, write=False)
    assert info.value.errno == errno.ESRCH


def test_memmove_copies_within_this_process() -> None:
    src = np.arange(1000, dtype=np.uint8)
    dst = np.zeros(1000, np.uint8)
    assert vm.memmove(dst.ctypes.data, src.ctypes.data, 1000)
    assert np.array_equal(src, dst)


def test_the_host_key_names_this_kernel_and_pid_namespace() -> None:
    key = vm.host_key()
    assert key and key == vm.host_key()
    out = subprocess.run(
        [sys.executable, "-c", "from danaus._rdma import vm; print(vm.host_key())"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == key
