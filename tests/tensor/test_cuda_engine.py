"""The tensor engine on GPUs (marked ``gpu``: skipped, saying why, without CUDA).

One GPU per proc from ``per_host={"gpus": n}``: worker ``k`` keeps its shards on
``cuda:(k % visible GPUs)`` and every proc sees every GPU of its host (so CUDA IPC
between them works). Collectives run on NCCL where the members of a group have GPUs
of their own, on gloo where they share one (NCCL refuses two ranks on one GPU).
The multi-GPU tests run unchanged where there are enough GPUs and skip, saying how
many they need, elsewhere; what one GPU allows runs everywhere CUDA does.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import danaus  # noqa: E402
import danaus.config  # noqa: E402
from danaus.actor import ProcMesh, this_host  # noqa: E402

from . import cuda_helpers, helpers  # noqa: E402
from .conftest import REPLY_TIMEOUT  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.torch]

device_facts = danaus.remote(cuda_helpers.device_facts, propagate=lambda x: None)
backend_of = danaus.remote(cuda_helpers.backend_of, propagate=lambda pg: None)
send_recv = danaus.remote(cuda_helpers.send_recv, propagate=lambda x, pg: x)
reduce_scatter_in = danaus.remote(
    cuda_helpers.reduce_scatter_in, propagate=lambda x, pg: x[0].clone()
)
all_reduce_in = danaus.remote(helpers.all_reduce_in)
all_gather_in = danaus.remote(helpers.all_gather_in)


@pytest.fixture(scope="module", autouse=True)
def cuda_engine() -> Iterator[None]:
    """The workers keep shards on their GPU (the default where the client sees one)."""
    with danaus.config.configured(tensor_device="cuda"):
        yield


def _mesh(n: int) -> Iterator[ProcMesh]:
    pm = this_host().spawn_procs(per_host={"gpus": n})
    assert pm.initialized.get(timeout=REPLY_TIMEOUT) is True
    yield pm
    pm.stop().get(timeout=REPLY_TIMEOUT)


@pytest.fixture(scope="module")
def one() -> Iterator[ProcMesh]:
    yield from _mesh(1)


@pytest.fixture(scope="module")
def shared() -> Iterator[ProcMesh]:
    """Two procs on however many GPUs there are (one GPU: they share it)."""
    yield from _mesh(2)


@pytest.fixture
def two(shared: ProcMesh, need_gpus: Any) -> ProcMesh:
    """Two procs with a GPU each."""
    need_gpus(2)
    return shared


# -- what one GPU allows ----------------------------------------------------------------


def test_a_one_proc_mesh_keeps_its_shards_on_the_gpu(one: ProcMesh) -> None:
    with one.activate():
        x = torch.arange(6.0) * 2
        facts = device_facts.call(x).get(timeout=REPLY_TIMEOUT)
        y = x + 1
    (f,) = facts.values()
    assert f["device"].startswith("cuda") and f["index"] == 0
    assert torch.equal(danaus.inspect(y).cpu(), torch.arange(6.0) * 2 + 1)


def test_collectives_of_world_size_one_run_on_nccl(one: ProcMesh) -> None:
    pg = one.process_group("gpus")
    with one.activate():
        x = torch.arange(4.0).reshape(1, 4) + 1
        backend = backend_of.call(pg).get(timeout=REPLY_TIMEOUT)
        summed = x.reduce("gpus", "sum")
        gathered = x.reduce("gpus", "stack")
        scattered = x.reduce("gpus", "sum", scatter=True)
        mine = all_reduce_in(x, pg)
    assert list(backend.values()) == ["nccl"]
    want = torch.arange(4.0).reshape(1, 4) + 1
    assert torch.equal(danaus.inspect(summed).cpu(), want)
    assert torch.equal(danaus.inspect(gathered).cpu(), want.unsqueeze(0))
    assert torch.equal(danaus.inspect(scattered).cpu(), want[0])
    assert torch.equal(danaus.inspect(mine).cpu(), want)


def test_procs_sharing_one_gpu_reduce_over_gloo_with_cuda_tensors(shared: ProcMesh) -> None:
    pg = shared.process_group("gpus")
    with shared.activate():
        x = torch.arange(3.0) + shared.rank("gpus")
        summed = x.reduce("gpus", "sum")
        backend = backend_of.call(pg).get(timeout=REPLY_TIMEOUT)
        facts = device_facts.call(x).get(timeout=REPLY_TIMEOUT)
    gpus = torch.cuda.device_count()
    assert all(f["device"].startswith("cuda") for f in facts.values())
    assert all(f["visible"] == gpus for f in facts.values())
    if gpus == 1:
        assert set(backend.values()) == {"gloo"}
    for g in range(2):
        assert torch.equal(danaus.inspect(summed, gpus=g).cpu(), torch.arange(3.0) * 2 + 1)


def test_to_mesh_moves_cuda_shards_between_meshes(one: ProcMesh) -> None:
    b = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        with one.activate():
            x = torch.arange(5.0) * 3
        y = x.to_mesh(b)
        with b.activate():
            z = y + 1
        assert torch.equal(danaus.inspect(z).cpu(), torch.arange(5.0) * 3 + 1)
    finally:
        b.stop().get(timeout=REPLY_TIMEOUT)


# -- several GPUs: skipped, saying how many they need, where fewer are shown ---------------


def test_each_proc_has_a_gpu_of_its_own(two: ProcMesh) -> None:
    with two.activate():
        facts = device_facts.call(torch.zeros(1)).get(timeout=REPLY_TIMEOUT)
    assert sorted(f["index"] for f in facts.values()) == [0, 1]


def test_all_reduce_reduce_scatter_and_all_gather_run_on_nccl(two: ProcMesh) -> None:
    pg = two.process_group("gpus")
    with two.activate():
        r = two.rank("gpus")
        x = torch.arange(4.0).reshape(2, 2) + 10 * r
        backend = backend_of.call(pg).get(timeout=REPLY_TIMEOUT)
        summed = x.reduce("gpus", "sum")
        gathered = all_gather_in(x, pg)
        scattered = reduce_scatter_in(x, pg)
        mine = all_reduce_in(x, pg)
    assert set(backend.values()) == {"nccl"}
    base = torch.arange(4.0).reshape(2, 2)
    total = base * 2 + 10
    for g in range(2):
        assert torch.equal(danaus.inspect(summed, gpus=g).cpu(), total)
        assert torch.equal(danaus.inspect(mine, gpus=g).cpu(), total)
        assert torch.equal(danaus.inspect(scattered, gpus=g).cpu(), total[g])
        assert torch.equal(danaus.inspect(gathered, gpus=g).cpu(), torch.stack([base, base + 10]))


def test_pipeline_stages_send_and_receive_over_nccl(two: ProcMesh) -> None:
    pg = two.process_group("gpus")
    with two.activate():
        x = torch.arange(6.0) + 100 * two.rank("gpus")
        got = send_recv(x, pg)
    assert torch.equal(danaus.inspect(got, gpus=1).cpu(), torch.arange(6.0))
    assert torch.equal(danaus.inspect(got, gpus=0).cpu(), torch.arange(6.0))


def test_the_distributed_tensors_tour_runs_on_cuda(capsys: pytest.CaptureFixture[str]) -> None:
    """Monarch's tour (``examples/distributed_tensors.py``) on a 2x2 mesh of CUDA workers:
    four procs share however many GPUs there are."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / "distributed_tensors.py"
    spec = importlib.util.spec_from_file_location("distributed_tensors", path)
    assert spec is not None and spec.loader is not None
    tour = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tour)
    tour.main()  # spawns its own {"host": 2, "gpu": 2} mesh and stops it
    out = capsys.readouterr().out
    assert "recovered from a remote failure" in out and "still working" in out
    assert "(host=1, gpu=1): a=[3.0, 3.0] sum over gpu=[5.0, 5.0] over host=[4.0, 4.0] " in out
    assert "data-parallel step 2" in out
    assert out.rstrip().endswith("done")
