"""``endpoint.rref``: an actor endpoint's results become distributed tensors.

Monarch's ``actor_rref`` (``mesh_controller.py``): the endpoint's
``propagate`` function gives the results' shapes on the client, so ``rref``
returns mesh tensors at once; each proc's shard is what the actor on that
proc returned. The call is ordered with the tensor ops of the stream both
ways, and an endpoint that raises fails the result tensors, not the actor.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest

import danaus
from danaus.actor import Actor, ProcMesh, current_rank, endpoint

from .conftest import COORDS, REPLY_TIMEOUT, base, failures_of, local_base, torch

pytestmark = [pytest.mark.torch, pytest.mark.timeout(180)]
ACTOR_INIT_TIMEOUT = 150.0


def _two_outputs(x: Any) -> Any:
    return x.sum(), {"doubled": x * 2}


class Layer(Actor):
    def __init__(self) -> None:
        self.calls: list[str] = []

    @endpoint(propagate=lambda x, k: x)
    def affine(self, x: Any, k: float) -> Any:
        self.calls.append("affine")
        return x * k + 1

    @endpoint(propagate=_two_outputs)
    def stats(self, x: Any) -> Any:
        return x.sum(), {"doubled": x * 2}

    @endpoint(propagate=lambda n: torch.empty(n))
    def own(self, n: int) -> Any:  # no tensor argument: the active mesh
        return torch.full((n,), float(current_rank().rank))

    @endpoint(propagate=lambda x: x)
    def scale_in_place(self, x: Any) -> Any:
        x.mul_(10)
        return x.clone()

    @endpoint(propagate=lambda x: x)
    def fails(self, x: Any) -> Any:
        raise ValueError(f"no result for a shard of shape {list(x.shape)}")

    @endpoint(propagate=lambda x: x)
    def returns_two(self, x: Any) -> Any:
        return x, x

    @endpoint
    def unpropagated(self, x: Any) -> Any:
        self.calls.append("unpropagated")
        return x

    @endpoint(propagate="inspect")
    def inspected(self, x: Any) -> None:
        self.calls.append("inspected")

    @endpoint
    def history(self) -> list[str]:
        return list(self.calls)


class AsyncLayer(Actor):
    @endpoint(propagate=lambda x: x)
    async def negate(self, x: Any) -> Any:
        return -x


@pytest.fixture(scope="module")
def layers(mesh: ProcMesh) -> Iterable[Any]:
    am = mesh.spawn("rref_layers", Layer)
    am.initialized.get(timeout=ACTOR_INIT_TIMEOUT)
    yield am
    am.stop().get(timeout=REPLY_TIMEOUT)


def _history(layers: Any) -> dict[tuple[int, int], list[str]]:
    vm = layers.history.call().get(timeout=REPLY_TIMEOUT)
    return {(p["host"], p["gpu"]): v for p, v in vm.items()}


def test_rref_returns_mesh_tensors_whose_shards_are_what_each_actor_returned(
    mesh: ProcMesh, layers: Any
) -> None:
    with mesh.activate():
        x = base(mesh)
        out = layers.affine.rref(x, 3.0)
        total, parts = layers.stats.rref(x)
    assert isinstance(out, danaus.Tensor) and out.shape == (6,)
    with mesh.activate():
        shifted = out - x  # refused (ValueError) were out on another mesh than x's
    assert torch.equal(danaus.inspect(shifted, host=1, gpu=1), local_base(1, 1) * 2 + 1)
    assert isinstance(total, danaus.Tensor) and total.shape == ()
    assert isinstance(parts["doubled"], danaus.Tensor)
    for h, g in COORDS:
        assert torch.equal(danaus.inspect(out, host=h, gpu=g), local_base(h, g) * 3 + 1)
        assert torch.equal(danaus.inspect(total, host=h, gpu=g), local_base(h, g).sum())
        assert torch.equal(danaus.inspect(parts["doubled"], host=h, gpu=g), local_base(h, g) * 2)


def test_rref_needs_no_active_mesh_when_given_mesh_tensors(mesh: ProcMesh, layers: Any) -> None:
    # Monarch's getting-started: `o = torch.relu(linear.forward.rref(t))`, outside activate().
    with mesh.activate():
        x = base(mesh)
    o = torch.relu(layers.affine.rref(x, -1.0) + 3)
    for h, g in COORDS:
        assert torch.equal(danaus.inspect(o, host=h, gpu=g), torch.relu(-local_base(h, g) + 4))


def test_rref_without_tensor_arguments_uses_the_active_mesh(mesh: ProcMesh, layers: Any) -> None:
    with mesh.activate():
        ranks = layers.own.rref(4)
        doubled = ranks * 2
    for i, (h, g) in enumerate(COORDS):  # actor rank i lives on proc (h, g), row-major
        assert torch.equal(danaus.inspect(doubled, host=h, gpu=g), torch.full((4,), 2.0 * i))
    with pytest.raises(ValueError, match="no mesh to put the results on"):
        layers.own.rref(4)


def test_rref_is_ordered_with_the_streams_ops_both_ways(mesh: ProcMesh, layers: Any) -> None:
    with mesh.activate():
        x = base(mesh)
        x.add_(1)  # the endpoint sees this
        copy = layers.scale_in_place.rref(x)  # writes x's shards in place
        after = x - 1  # issued after: sees the write, though nobody waited for it
    for h, g in COORDS:
        expect = (local_base(h, g) + 1) * 10
        assert torch.equal(danaus.inspect(copy, host=h, gpu=g), expect)
        assert torch.equal(danaus.inspect(after, host=h, gpu=g), expect - 1)


def test_an_endpoint_that_raises_fails_the_results_and_the_actor_goes_on(
    mesh: ProcMesh, layers: Any
) -> None:
    with mesh.activate():
        x = base(mesh)
        bad = layers.fails.rref(x)
        later = bad + 1  # depends on the failed result: fails too
        fine = x + 1  # the stream goes on
    with pytest.raises(danaus.RemoteTensorError, match="no result for a shard of shape") as e:
        danaus.inspect(later, host=0, gpu=1)
    assert "rref_layers.fails()" in str(e.value)
    assert torch.equal(danaus.inspect(fine, host=1, gpu=0), local_base(1, 0) + 1)
    assert set(_history(layers)) == set(COORDS)  # every actor still answers


def test_results_that_do_not_match_propagate_fail_the_result(mesh: ProcMesh, layers: Any) -> None:
    with mesh.activate():
        x = base(mesh)
        wrong = layers.returns_two.rref(x)
    with pytest.raises(danaus.RemoteTensorError, match=r"returned 2 tensors .* expected 1"):
        danaus.inspect(wrong, host=1, gpu=1)


def test_a_failed_input_fails_the_result(mesh: ProcMesh, layers: Any) -> None:
    with mesh.activate():
        x = base(mesh)
        broken = x[torch.tensor([7])]  # index out of range on every worker
        out = layers.affine.rref(broken, 2.0)
    with pytest.raises(danaus.RemoteTensorError, match="aten::index"):
        danaus.inspect(out, host=0, gpu=0)


def test_an_endpoint_without_propagate_is_refused_before_sending(
    mesh: ProcMesh, layers: Any
) -> None:
    before = _history(layers)
    with mesh.activate():
        x = base(mesh)
        with pytest.raises(NotImplementedError, match="propagate="):
            layers.unpropagated.rref(x)
        assert layers.inspected.rref(x) is None  # "inspect": no tensor results, but it runs
    after = _history(layers)
    for coord in COORDS:
        assert after[coord][len(before[coord]) :] == ["inspected"]


def test_actors_that_are_not_one_per_proc_are_refused_before_sending(
    mesh: ProcMesh, layers: Any
) -> None:
    before = _history(layers)
    local = torch.ones(6)
    with mesh.activate():
        x = base(mesh)
        with pytest.raises(ValueError, match=r"every proc of .* needs one actor"):
            layers.slice(host=0).affine.rref(x, 2.0)
        with pytest.raises(ValueError, match="local tensor"):
            layers.affine.rref(local, 2.0)
        y = x + 1  # nothing was queued on the stream by the refused calls
    assert torch.equal(danaus.inspect(y, host=1, gpu=1), local_base(1, 1) + 1)
    assert _history(layers) == before


def test_an_async_endpoint_rref(mesh: ProcMesh) -> None:
    am = mesh.spawn("rref_async", AsyncLayer)
    am.initialized.get(timeout=ACTOR_INIT_TIMEOUT)
    try:
        with mesh.activate():
            out = am.negate.rref(base(mesh))
        assert torch.equal(danaus.inspect(out, host=1, gpu=0), -local_base(1, 0))
    finally:
        am.stop().get(timeout=REPLY_TIMEOUT)


def test_an_actor_that_failed_before_the_call_fails_the_results(mesh: ProcMesh) -> None:
    am = mesh.spawn("rref_doomed", Layer)
    am.initialized.get(timeout=ACTOR_INIT_TIMEOUT)
    try:
        with failures_of("rref_doomed", 4), mesh.activate():
            x = base(mesh)
            am.fails.broadcast(x)  # a broadcast's exception fails the actor
            out = am.affine.rref(x, 2.0)  # queued behind it: will not run
            y = x + 1  # the stream must not wait for that call forever
        assert torch.equal(danaus.inspect(y, host=1, gpu=1), local_base(1, 1) + 1)
        with pytest.raises(danaus.RemoteTensorError, match="failed before it ran the call"):
            danaus.inspect(out, host=0, gpu=1)
    finally:
        am.stop().get(timeout=REPLY_TIMEOUT)


def test_an_actor_known_to_have_failed_fails_the_results_not_the_call(mesh: ProcMesh) -> None:
    """The same whether or not the client heard of the failure before the call: the
    results fail (raising at the call instead made the program's behaviour depend on
    timing, and left the streams waiting for a hand-off that was never sent)."""
    am = mesh.spawn("rref_known_failed", Layer)
    am.initialized.get(timeout=ACTOR_INIT_TIMEOUT)
    try:
        with failures_of("rref_known_failed", 4), mesh.activate():
            x = base(mesh)
            am.fails.broadcast(x)
        # failures_of waited for all four failures: the client knows of them now.
        with mesh.activate():
            out = am.affine.rref(x, 2.0)
            y = x + 1
        assert torch.equal(danaus.inspect(y, host=0, gpu=1), local_base(0, 1) + 1)
        with pytest.raises(danaus.RemoteTensorError, match="failed before it ran the call"):
            danaus.inspect(out, host=1, gpu=0)
    finally:
        am.stop().get(timeout=REPLY_TIMEOUT)
