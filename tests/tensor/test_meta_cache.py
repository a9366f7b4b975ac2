"""The client's cache of op results' metadata: a repeated op skips the meta computation.

Hits must give what misses give (values checked against local torch), a
mismatch must still raise at the op after the cache is warm, and in-place
ops and views must keep writing through to their base.
"""

from __future__ import annotations

from typing import Any

import pytest

import danaus
from danaus._tensor import tensor as tensor_mod
from danaus.actor import ProcMesh

from .conftest import COORDS, base, local_base, torch

pytestmark = pytest.mark.torch


def _step(x: Any, w: Any) -> tuple[Any, Any]:
    """Functional ops, a view, in-place ops through a view and on a list (``_foreach``)."""
    y = torch.tanh(x.reshape(2, 3) @ w) + 1
    v = y[1:]  # a view with a storage offset
    v.mul_(2)  # in place, through the view: writes into y
    y.add_(x.reshape(2, 3)[:, :2].sum())
    a, b = y[0].clone(), y[1].clone()
    torch._foreach_add_([a, b], [b, a], alpha=0.5)
    return y, a + b


def _local_step(x: Any, w: Any) -> tuple[Any, Any]:
    return _step(x, w)


def test_repeated_ops_hit_the_cache_and_give_what_local_torch_gives(mesh: ProcMesh) -> None:
    tensor_mod._META_CACHE.clear()
    with mesh.activate():
        w = torch.ones(3, 2) * 0.25
        x = base(mesh)
        first = _step(x, w)
        size = len(tensor_mod._META_CACHE)
        second = _step(x, w)  # every op again, same shapes
        assert len(tensor_mod._META_CACHE) == size  # all hits, nothing new
        third = _step(x * 2, w)
    assert size > 0
    for h, g in COORDS:
        lw = torch.ones(3, 2) * 0.25
        lx = local_base(h, g)
        for got, want in ((first, _local_step(lx, lw)), (second, _local_step(lx, lw))):
            for g_t, w_t in zip(got, want, strict=True):
                assert torch.allclose(danaus.inspect(g_t, host=h, gpu=g), w_t)
        for g_t, w_t in zip(third, _local_step(lx * 2, lw), strict=True):
            assert torch.allclose(danaus.inspect(g_t, host=h, gpu=g), w_t)


def test_in_place_ops_from_the_cache_return_their_input_and_write_the_base(
    mesh: ProcMesh,
) -> None:
    with mesh.activate():
        x = base(mesh).reshape(2, 3)
        outs = []
        for _ in range(3):  # the second and third come from the cache
            row = x[1]
            outs.append(row.add_(1))
            assert outs[-1] is row
            x.mul_(2)
    for h, g in COORDS:
        expect = local_base(h, g).reshape(2, 3)
        for _ in range(3):
            expect[1].add_(1)
            expect.mul_(2)
        assert torch.equal(danaus.inspect(x, host=h, gpu=g), expect)


def test_a_shape_mismatch_after_warm_up_still_raises_at_the_op(mesh: ProcMesh) -> None:
    with mesh.activate():
        a, b = torch.ones(2, 3), torch.ones(3, 2)
        for _ in range(2):
            c = a @ b
            a.add_(b.T)
        bad = torch.ones(2, 2)
        with pytest.raises(RuntimeError, match="same reduction dim"):
            a @ bad
        with pytest.raises(RuntimeError, match="broadcast"):
            a.add_(torch.ones(4))
        with pytest.raises(RuntimeError, match=r"Promotion|result type"):
            torch.ones(2, 3, dtype=torch.int64).add_(a)  # float into int, in place
        d = a @ b  # the engine goes on after the errors
    assert torch.equal(danaus.inspect(c), torch.full((2, 2), 6.0))
    assert torch.equal(danaus.inspect(d), torch.full((2, 2), 9.0))


def test_an_op_that_changes_sizes_in_place_is_not_cached(mesh: ProcMesh) -> None:
    tensor_mod._META_CACHE.clear()
    with mesh.activate():
        x = base(mesh).reshape(2, 3)
        x.t_()
    assert not any(k[0] == "aten::t_" for k in tensor_mod._META_CACHE)
