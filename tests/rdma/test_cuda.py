"""CUDA tensors in RDMABuffer, on a real GPU (marked ``gpu``: skipped, saying why, without CUDA).

Everything here runs on one GPU: two procs of this host share it (each sees
every GPU, as danaus's procs do), so a CUDA buffer owned by one is opened by
the other through CUDA IPC; a ``danaus worker`` on loopback (another host for
the data plane) makes the owner's data server stage its GPU memory through
pinned host memory; a CUDA destination reading host memory stages on the
reader's side. Bytes are random and never zero, so a transfer that moved
nothing cannot pass.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import danaus.actor  # noqa: E402
from danaus.actor import Actor, ActorMesh, HostMesh, ProcMesh, endpoint, this_host  # noqa: E402
from danaus.rdma import RDMABuffer, RDMAError, RDMAOwnerLostError  # noqa: E402
from danaus.testing import FaultRecorder  # noqa: E402

from .conftest import REPLY_TIMEOUT, random_bytes  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.torch]

MiB = 1 << 20


def _tensor(n: int, seed: int, device: str) -> Any:
    return torch.from_numpy(random_bytes(n, seed)).to(device)


def _bytes(t: Any) -> bytes:
    return bytes(t.cpu().numpy().tobytes())


class GpuHolder(Actor):
    """Owns named tensors (CPU or CUDA) registered as buffers; reads and writes others'."""

    def __init__(self) -> None:
        self.items: dict[str, tuple[Any, RDMABuffer]] = {}

    @endpoint
    def make(self, name: str, n: int, device: str, seed: int = 0) -> RDMABuffer:
        t = _tensor(n, seed, device)
        buf = RDMABuffer(t)
        self.items[name] = (t, buf)
        return buf

    @endpoint
    def contents(self, name: str) -> bytes:
        t, _ = self.items[name]
        return _bytes(t)

    @endpoint
    def read(self, buf: RDMABuffer, device: str) -> bytes:
        dst = torch.zeros(buf.size(), dtype=torch.uint8, device=device)
        buf.read_into(dst, timeout=REPLY_TIMEOUT).get()
        return _bytes(dst)

    @endpoint
    def write(self, buf: RDMABuffer, data: bytes, device: str) -> None:
        src = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)
        buf.write_from(src, timeout=REPLY_TIMEOUT).get()

    @endpoint
    def backend(self, buf: RDMABuffer) -> str:
        return buf.backend

    @endpoint
    def drop(self, name: str) -> None:
        self.items.pop(name)[1].drop().get()

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def allocated(self) -> int:
        """The bytes torch's allocator holds for tensors here, once garbage is collected."""
        return _allocated()


def _allocated() -> int:
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.ipc_collect()
    return int(torch.cuda.memory_allocated())


@pytest.fixture(scope="module")
def faults() -> Iterator[FaultRecorder]:
    recorder = FaultRecorder()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(danaus.actor, "unhandled_fault_hook", recorder)
        yield recorder


@pytest.fixture(scope="module")
def procs(faults: FaultRecorder) -> Iterator[ProcMesh]:
    """Two procs of this host sharing the GPU."""
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    assert pm.initialized.get(timeout=REPLY_TIMEOUT) is True
    yield pm
    pm.stop().get(timeout=REPLY_TIMEOUT)


@pytest.fixture(scope="module")
def holders(procs: ProcMesh) -> ActorMesh[GpuHolder]:
    mesh = procs.spawn("gpu_holders", GpuHolder)
    mesh.initialized.get(timeout=REPLY_TIMEOUT)
    return mesh


def _pair(holders: ActorMesh[GpuHolder]) -> tuple[Any, Any]:
    return holders.slice(gpus=0), holders.slice(gpus=1)


# -- between two procs of one host (CUDA IPC, or staged where host memory is involved) --


@pytest.mark.parametrize(("owner", "reader"), [("cuda", "cuda"), ("cuda", "cpu"), ("cpu", "cuda")])
@pytest.mark.parametrize("n", [1000, 20 * MiB + 3])
def test_a_proc_reads_and_writes_another_procs_buffer_across_devices(
    holders: ActorMesh[GpuHolder], owner: str, reader: str, n: int
) -> None:
    a, b = _pair(holders)
    name = f"rw-{owner}-{reader}-{n}"
    buf = a.make.call_one(name, n, owner, 1).get(timeout=REPLY_TIMEOUT)
    want = a.contents.call_one(name).get(timeout=REPLY_TIMEOUT)
    assert b.read.call_one(buf, reader).get(timeout=REPLY_TIMEOUT) == want
    data = bytes(random_bytes(n, 2))
    b.write.call_one(buf, data, reader).get(timeout=REPLY_TIMEOUT)
    assert a.contents.call_one(name).get(timeout=REPLY_TIMEOUT) == data
    a.drop.call_one(name).get(timeout=REPLY_TIMEOUT)


def test_a_cuda_buffer_on_this_host_moves_by_cuda_ipc(holders: ActorMesh[GpuHolder]) -> None:
    a, b = _pair(holders)
    buf = a.make.call_one("ipc", 4096, "cuda").get(timeout=REPLY_TIMEOUT)
    assert b.backend.call_one(buf).get(timeout=REPLY_TIMEOUT) == "cuda_ipc"
    assert buf.backend == "cuda_ipc"  # the client sees the GPU too
    assert "cuda:" in str(buf)
    a.drop.call_one("ipc").get(timeout=REPLY_TIMEOUT)


def test_the_client_reads_a_procs_cuda_buffer_into_cuda_and_host_memory(
    holders: ActorMesh[GpuHolder],
) -> None:
    a, _ = _pair(holders)
    buf = a.make.call_one("client", 3 * MiB + 1, "cuda", 5).get(timeout=REPLY_TIMEOUT)
    want = a.contents.call_one("client").get(timeout=REPLY_TIMEOUT)
    for _ in range(3):  # the IPC handle is opened once and reused
        dst = torch.zeros(buf.size(), dtype=torch.uint8, device="cuda")
        buf.read_into(dst).get(timeout=REPLY_TIMEOUT)
        assert _bytes(dst) == want
    host = bytearray(buf.size())
    buf.read_into(host).get(timeout=REPLY_TIMEOUT)
    assert bytes(host) == want
    a.drop.call_one("client").get(timeout=REPLY_TIMEOUT)


def test_a_buffer_the_client_owns_on_its_gpu_round_trips_in_the_client() -> None:
    t = _tensor(1 << 16, 7, "cuda")
    buf = RDMABuffer(t)
    out = torch.zeros_like(t)
    buf.read_into(out).get(timeout=REPLY_TIMEOUT)
    assert torch.equal(out, t)
    host = torch.zeros(t.numel(), dtype=torch.uint8)
    buf.read_into(host).get(timeout=REPLY_TIMEOUT)
    assert torch.equal(host, t.cpu())
    buf.write_from(torch.full_like(t, 9)).get(timeout=REPLY_TIMEOUT)
    assert bool((t == 9).all())
    buf.drop().get(timeout=REPLY_TIMEOUT)


def test_a_float_cuda_tensor_is_its_raw_bytes() -> None:
    t = torch.randn(1000, device="cuda")
    buf = RDMABuffer(t)
    out = torch.zeros(4000, dtype=torch.uint8, device="cuda")
    buf.read_into(out).get(timeout=REPLY_TIMEOUT)
    assert torch.equal(out.view(torch.float32), t)
    buf.drop().get(timeout=REPLY_TIMEOUT)


def test_a_dropped_cuda_buffer_gives_its_memory_back_with_its_tensor() -> None:
    """The export's reference (``_share_cuda_``) is returned at the drop: torch frees the
    memory with the tensor instead of keeping it in its IPC limbo for the process's life."""
    before = _allocated()
    t = torch.ones(8 * MiB, dtype=torch.uint8, device="cuda")
    buf = RDMABuffer(t)
    buf.drop().get(timeout=REPLY_TIMEOUT)
    del t, buf
    assert _allocated() == before


def test_a_dropped_cuda_buffer_that_two_peers_opened_gives_its_memory_back(
    holders: ActorMesh[GpuHolder],
) -> None:
    a, b = _pair(holders)
    before = a.allocated.call_one().get(timeout=REPLY_TIMEOUT)
    buf = a.make.call_one("freed", 8 * MiB, "cuda", 6).get(timeout=REPLY_TIMEOUT)
    want = a.contents.call_one("freed").get(timeout=REPLY_TIMEOUT)
    assert b.read.call_one(buf, "cuda").get(timeout=REPLY_TIMEOUT) == want  # b opens it
    dst = torch.zeros(buf.size(), dtype=torch.uint8, device="cuda")
    buf.read_into(dst).get(timeout=REPLY_TIMEOUT)  # and so does the client
    assert _bytes(dst) == want
    a.drop.call_one("freed").get(timeout=REPLY_TIMEOUT)
    assert a.allocated.call_one().get(timeout=REPLY_TIMEOUT) == before


# -- stream order ----------------------------------------------------------------------


def test_a_write_waits_for_work_queued_on_the_sources_current_stream() -> None:
    dst = torch.zeros(1 << 20, dtype=torch.uint8, device="cuda")
    buf = RDMABuffer(dst)
    src = torch.zeros(1 << 20, dtype=torch.uint8, device="cuda")
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # keeps the stream busy well past the copy's issue
        src.fill_(7)
        fut = buf.write_from(src)
    fut.get(timeout=REPLY_TIMEOUT)
    torch.cuda.synchronize()
    assert bool((dst == 7).all()), "the copy ran before the fill queued ahead of it"
    buf.drop().get(timeout=REPLY_TIMEOUT)


def test_work_queued_after_a_read_on_the_stream_sees_its_bytes() -> None:
    src = torch.full((1 << 20,), 3, dtype=torch.uint8, device="cuda")
    buf = RDMABuffer(src)
    dst = torch.zeros_like(src)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        buf.read_into(dst).get(timeout=REPLY_TIMEOUT)
        dst.add_(1)
    side.synchronize()
    assert bool((dst == 4).all())
    buf.drop().get(timeout=REPLY_TIMEOUT)


# -- misuse and failures ------------------------------------------------------------------


def test_a_non_contiguous_cuda_destination_is_refused_naming_device_dtype_and_size() -> None:
    buf = RDMABuffer(torch.ones(64, dtype=torch.float32, device="cuda"))
    dst = torch.zeros(8, 16, dtype=torch.float32, device="cuda").t()
    with pytest.raises(ValueError, match="non-contiguous") as e:
        buf.read_into(dst)
    assert "cuda:0" in str(e.value) and "torch.float32" in str(e.value)
    buf.drop().get(timeout=REPLY_TIMEOUT)


def test_a_too_small_cuda_destination_is_refused_naming_device_and_sizes() -> None:
    buf = RDMABuffer(torch.ones(64, dtype=torch.float32, device="cuda"))
    dst = torch.zeros(10, dtype=torch.float16, device="cuda")
    with pytest.raises(ValueError, match="holds 20 bytes") as e:
        buf.read_into(dst)
    assert "cuda:0" in str(e.value) and "torch.float16" in str(e.value) and "256" in str(e.value)
    with pytest.raises(ValueError, match="non-contiguous"):
        RDMABuffer(torch.zeros(4, 4, device="cuda").t())
    buf.drop().get(timeout=REPLY_TIMEOUT)


def test_a_dropped_cuda_buffer_fails_later_transfers(holders: ActorMesh[GpuHolder]) -> None:
    a, _ = _pair(holders)
    buf = a.make.call_one("dropped", 4096, "cuda").get(timeout=REPLY_TIMEOUT)
    a.drop.call_one("dropped").get(timeout=REPLY_TIMEOUT)
    with pytest.raises(RDMAError, match="dropped"):
        buf.read_into(torch.zeros(4096, dtype=torch.uint8, device="cuda")).get(
            timeout=REPLY_TIMEOUT
        )


@pytest.fixture
def victim(faults: FaultRecorder) -> Iterator[tuple[Any, int, ProcMesh]]:
    pm = this_host().spawn_procs(per_host={"v": 1})
    holder = pm.spawn("gpu_victim", GpuHolder)
    pid = holder.pid.call_one().get(timeout=REPLY_TIMEOUT)
    yield holder, pid, pm
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)
    with contextlib.suppress(Exception):
        pm.stop().get(timeout=REPLY_TIMEOUT)


def test_a_stopped_owner_of_a_cuda_buffer_times_out_naming_it(victim: Any) -> None:
    holder, pid, _ = victim
    buf = holder.make.call_one("stopped", 4096, "cuda").get(timeout=REPLY_TIMEOUT)
    os.kill(pid, signal.SIGSTOP)
    dst = torch.zeros(4096, dtype=torch.uint8, device="cuda")
    with pytest.raises(TimeoutError, match="timed out after 1 s") as e:
        buf.read_into(dst, timeout=1).get(timeout=REPLY_TIMEOUT)
    assert str(buf) in str(e.value)


def test_a_dead_owner_of_a_cuda_buffer_fails_the_transfer_at_once(
    victim: Any, faults: FaultRecorder
) -> None:
    holder, pid, _ = victim
    buf = holder.make.call_one("dead", 4096, "cuda").get(timeout=REPLY_TIMEOUT)
    os.kill(pid, signal.SIGKILL)
    dst = torch.zeros(4096, dtype=torch.uint8, device="cuda")
    with pytest.raises(RDMAOwnerLostError):
        buf.read_into(dst, timeout=REPLY_TIMEOUT).get(timeout=REPLY_TIMEOUT)


# -- another host: staged through pinned host memory on both sides -----------------------


@pytest.fixture(scope="module")
def remote(faults: FaultRecorder) -> Iterator[HostMesh]:
    from loopback_worker import loopback_worker

    with loopback_worker() as hm:
        yield hm


@pytest.mark.parametrize(("owner", "reader"), [("cuda", "cuda"), ("cuda", "cpu"), ("cpu", "cuda")])
def test_cuda_memory_moves_across_hosts_staged_through_pinned_memory(
    remote: HostMesh, owner: str, reader: str, settings: Any
) -> None:
    settings(rdma_cuda_chunk=1 * MiB)  # several chunks: the pipeline runs
    pm = remote.spawn_procs(per_host={"r": 1})
    try:
        holder = pm.spawn("gpu_remote", GpuHolder)
        n = 9 * MiB + 5
        buf = holder.make.call_one("far", n, owner, 3).get(timeout=REPLY_TIMEOUT)
        assert buf.backend == "tcp"
        want = holder.contents.call_one("far").get(timeout=REPLY_TIMEOUT)
        dst = torch.zeros(n, dtype=torch.uint8, device=reader)
        buf.read_into(dst).get(timeout=REPLY_TIMEOUT)
        assert _bytes(dst) == want
        src = _tensor(n, 4, reader)
        buf.write_from(src).get(timeout=REPLY_TIMEOUT)
        assert holder.contents.call_one("far").get(timeout=REPLY_TIMEOUT) == _bytes(src)
    finally:
        pm.stop().get(timeout=REPLY_TIMEOUT)
