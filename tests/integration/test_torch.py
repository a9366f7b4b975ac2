"""torch tensors travel through endpoints (CPU, out of band). Skipped without torch."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from danaus.actor import Actor, ActorMesh, ProcMesh, endpoint

from .conftest import REPLY_TIMEOUT

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch


class TensorActor(Actor):
    @endpoint
    def echo(self, t: Any) -> Any:
        return t

    @endpoint
    def describe(self, t: Any) -> tuple[str, tuple[int, ...], float]:
        return str(t.dtype), tuple(t.shape), float(t.double().sum())

    @endpoint
    def add_rank(self, t: Any) -> Any:
        from danaus.actor import current_rank

        return t + current_rank().rank

    @endpoint
    def make(self, n: int) -> Any:
        return torch.arange(n, dtype=torch.int64)


@pytest.fixture(scope="module")
def tensors(procs: ProcMesh) -> Iterator[ActorMesh[TensorActor]]:
    mesh = procs.spawn("tensors", TensorActor)
    yield mesh
    mesh.stop().get(timeout=REPLY_TIMEOUT)


@pytest.mark.timeout(90)
def test_four_mib_tensor_round_trips_exactly(tensors) -> None:
    t = torch.randn(1 << 20, generator=torch.Generator().manual_seed(0))  # float32, 4 MiB
    back = tensors.slice(gpus=0).echo.call_one(t).get(timeout=60)
    assert isinstance(back, torch.Tensor)
    assert back.dtype == torch.float32
    assert back.shape == t.shape
    assert torch.equal(back, t)


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.arange(6 * 4096, dtype=torch.int16).reshape(6, 4096),
        lambda: torch.ones(4096, dtype=torch.bfloat16) * 1.5,
        lambda: torch.arange(8192, dtype=torch.float64).reshape(64, 128).t(),
        lambda: torch.tensor([1.0, 2.0], requires_grad=True),
        lambda: torch.arange(10, dtype=torch.uint8),
        lambda: torch.zeros(0, 3),
    ],
    ids=["int16-2d", "bfloat16", "transposed", "requires-grad", "small", "empty"],
)
def test_tensors_keep_dtype_shape_and_values(tensors, make: Any) -> None:
    t = make()
    back = tensors.slice(gpus=1).echo.call_one(t).get(timeout=REPLY_TIMEOUT)
    assert back.dtype == t.dtype
    assert back.shape == t.shape
    assert torch.equal(back.detach(), t.detach())


def test_tensor_sent_to_every_rank_is_computed_on_and_returned(tensors) -> None:
    t = torch.zeros(1 << 18, dtype=torch.float32)
    results = tensors.add_rank.call(t).get(timeout=REPLY_TIMEOUT)
    for point, value in results.items():
        assert torch.equal(value, torch.full_like(t, float(point.rank)))


def test_tensor_made_by_an_actor_comes_back_writable(tensors) -> None:
    back = tensors.slice(gpus=0).make.call_one(1 << 16).get(timeout=REPLY_TIMEOUT)
    assert back.dtype == torch.int64
    back[0] = 99  # a read-only view of the frame would fail or warn here
    assert int(back[0]) == 99
    assert int(back[-1]) == (1 << 16) - 1
