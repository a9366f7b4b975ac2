"""The NIXL backend on CUDA memory (VRAM): needs a GPU; skipped, saying so, without one.

Procs of one host share the GPU (device 0): NIXL moves VRAM between them over
UCX's CUDA transports (CUDA IPC), and between VRAM and DRAM either way.
"""

from __future__ import annotations

import importlib.util
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from danaus.actor import Actor, ActorMesh, ProcMesh, endpoint, this_host
from danaus.config import configure, configured
from danaus.rdma import RDMABuffer

from .conftest import REPLY_TIMEOUT

torch = pytest.importorskip("torch")
if importlib.util.find_spec("nixl") is None:  # a GPU machine without the nixl extra
    pytest.skip("needs NIXL: pip install 'danaus[nixl]'", allow_module_level=True)

pytestmark = [pytest.mark.gpu, pytest.mark.torch]  # skipped, saying why, without CUDA

MiB = 1 << 20


def _pattern(n: int, seed: int, device: str) -> Any:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, 256, (n,), dtype=torch.uint8, generator=g).to(device)


class CudaHolder(Actor):
    """Registers CUDA tensors with NIXL (``rdma_backend="auto"``: CUDA memory goes to
    NIXL where it is installed)."""

    def __init__(self) -> None:
        configure(rdma_backend="auto")
        self.items: dict[str, tuple[Any, RDMABuffer]] = {}

    @endpoint
    def make(self, name: str, n: int, seed: int) -> RDMABuffer:
        t = _pattern(n, seed, "cuda")
        torch.cuda.synchronize()
        buf = RDMABuffer(t)
        self.items[name] = (t, buf)
        return buf

    @endpoint
    def contents(self, name: str) -> bytes:
        return bytes(self.items[name][0].cpu().numpy().tobytes())

    @endpoint
    def read_to_cuda(self, buf: RDMABuffer) -> bytes:
        dst = torch.zeros(buf.size(), dtype=torch.uint8, device="cuda")
        buf.read_into(dst, timeout=REPLY_TIMEOUT).get(timeout=REPLY_TIMEOUT)
        return bytes(dst.cpu().numpy().tobytes())


@pytest.fixture(scope="module")
def cuda_holders() -> Iterator[ActorMesh[CudaHolder]]:
    pm: ProcMesh = this_host().spawn_procs(per_host={"g": 2})
    mesh = pm.spawn("cuda_holders", CudaHolder)
    mesh.initialized.get(timeout=60)
    yield mesh
    pm.stop().get(timeout=REPLY_TIMEOUT)


@pytest.mark.parametrize("n", [4097, 16 * MiB])
def test_vram_moves_between_procs_sharing_a_gpu_over_nixl(
    cuda_holders: ActorMesh[CudaHolder], n: int
) -> None:
    name = uuid.uuid4().hex[:8]
    buf = cuda_holders.slice(g=0).make.call_one(name, n, 3).get(timeout=60)
    assert buf.backend == "nixl"
    got = cuda_holders.slice(g=1).read_to_cuda.call_one(buf).get(timeout=60)
    assert got == _pattern(n, 3, "cpu").numpy().tobytes()


def test_the_client_reads_vram_into_cuda_and_cpu_memory_and_writes_it_from_both(
    cuda_holders: ActorMesh[CudaHolder],
) -> None:
    name = uuid.uuid4().hex[:8]
    owner = cuda_holders.slice(g=0)
    buf = owner.make.call_one(name, 4 * MiB, 5).get(timeout=60)
    want = _pattern(4 * MiB, 5, "cpu")
    on_gpu = torch.zeros(4 * MiB, dtype=torch.uint8, device="cuda")
    buf.read_into(on_gpu).get(timeout=60)
    assert torch.equal(on_gpu.cpu(), want)
    on_cpu = torch.zeros(4 * MiB, dtype=torch.uint8)
    buf.read_into(on_cpu).get(timeout=60)
    assert torch.equal(on_cpu, want)
    src = _pattern(MiB, 6, "cuda")
    buf.write_from(src).get(timeout=60)  # waits for the kernel that made src (stream order)
    after = owner.contents.call_one(name).get(timeout=60)
    assert after[:MiB] == _pattern(MiB, 6, "cpu").numpy().tobytes()
    buf.write_from(_pattern(MiB, 7, "cpu")).get(timeout=60)
    after = owner.contents.call_one(name).get(timeout=60)
    assert after[:MiB] == _pattern(MiB, 7, "cpu").numpy().tobytes()


def test_a_cpu_nixl_buffer_of_the_client_is_read_into_vram_by_a_proc(
    cuda_holders: ActorMesh[CudaHolder],
) -> None:
    data = _pattern(2 * MiB, 8, "cpu")
    with configured(rdma_backend="nixl"):
        buf = RDMABuffer(data)
    got = cuda_holders.slice(g=1).read_to_cuda.call_one(buf).get(timeout=60)
    assert got == data.numpy().tobytes()
    buf.drop().get(timeout=REPLY_TIMEOUT)
