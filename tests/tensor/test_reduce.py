"""Collectives over mesh dimensions, checked against the same reduction in local torch."""

from __future__ import annotations

import functools
from typing import Any

import pytest

import danaus
from danaus.actor import ProcMesh

from .conftest import COORDS, base, local_base, torch

pytestmark = pytest.mark.torch

DIMS = {"gpu": ("gpu",), "host": ("host",), "both": ("host", "gpu"), "all": ()}


def _group(dims: tuple[str, ...], h: int, g: int) -> list[tuple[int, int]]:
    """The coordinates reduced together with (h, g), row-major."""
    dims = dims or ("host", "gpu")
    return [
        (hh, gg) for hh, gg in COORDS if ("host" in dims or hh == h) and ("gpu" in dims or gg == g)
    ]


def _local(reduction: str, values: list[Any]) -> Any:
    s = torch.stack(values)
    if reduction in ("band", "bor", "bxor"):
        fn = {"band": torch.bitwise_and, "bor": torch.bitwise_or, "bxor": torch.bitwise_xor}
        return functools.reduce(fn[reduction], values)
    return {
        "sum": lambda: s.sum(0),
        "avg": lambda: s.mean(0),
        "product": lambda: s.prod(0),
        "min": lambda: s.amin(0),
        "max": lambda: s.amax(0),
        "stack": lambda: s,
    }[reduction]()


def _input(mesh: ProcMesh, reduction: str) -> Any:
    x = base(mesh)
    return x.long() if reduction in ("band", "bor", "bxor") else x


def _local_input(reduction: str, h: int, g: int) -> Any:
    x = local_base(h, g)
    return x.long() if reduction in ("band", "bor", "bxor") else x


# stack takes one dimension only (its error is tested below)
CASES = [
    (reduction, dims)
    for reduction in ["sum", "avg", "product", "min", "max", "band", "bor", "bxor", "stack"]
    for dims in sorted(DIMS)
    if not (reduction == "stack" and dims in ("both", "all"))
]


@pytest.mark.parametrize(("reduction", "dims"), CASES)
def test_reduce_gives_every_shard_its_groups_reduction(
    mesh: ProcMesh, reduction: str, dims: str
) -> None:
    with mesh.activate():
        r = _input(mesh, reduction).reduce(DIMS[dims], reduction)
    for h, g in COORDS:
        group = [_local_input(reduction, hh, gg) for hh, gg in _group(DIMS[dims], h, g)]
        expect = _local(reduction, group)
        got = danaus.inspect(r, host=h, gpu=g)
        assert got.dtype == expect.dtype
        assert torch.allclose(got, expect), (h, g)


@pytest.mark.parametrize("dim", ["gpu", "host"])
@pytest.mark.parametrize("reduction", ["sum", "max", "stack"])
def test_scatter_gives_shard_k_row_k(mesh: ProcMesh, dim: str, reduction: str) -> None:
    with mesh.activate():
        r = base(mesh).reshape(2, 3).reduce(dim, reduction, scatter=True)
    for h, g in COORDS:
        k = g if dim == "gpu" else h
        group = [local_base(hh, gg).reshape(2, 3) for hh, gg in _group((dim,), h, g)]
        if reduction == "stack":  # all-to-all: row k of every member's input
            expect = torch.stack([v[k] for v in group])
        else:
            expect = _local(reduction, group)[k]
        assert torch.equal(danaus.inspect(r, host=h, gpu=g), expect)


def test_reduce_in_place_and_over_a_pytree(mesh: ProcMesh) -> None:
    with mesh.activate():
        a = base(mesh)
        b = base(mesh) * 2
        same = a.reduce_("gpu", "max")
        out = danaus.reduce({"a": a, "b": b, "n": 3}, "host", "sum")
        danaus.reduce_([b], "gpu", "min")
    assert same is a
    assert out["n"] == 3
    for h, g in COORDS:
        amax = torch.maximum(local_base(h, 0), local_base(h, 1))
        assert torch.equal(danaus.inspect(a, host=h, gpu=g), amax)
        other = torch.maximum(local_base(1 - h, 0), local_base(1 - h, 1))
        assert torch.equal(danaus.inspect(out["a"], host=h, gpu=g), amax + other)
        assert torch.equal(
            danaus.inspect(out["b"], host=h, gpu=g), 2 * (local_base(0, g) + local_base(1, g))
        )
        assert torch.equal(danaus.inspect(b, host=h, gpu=g), 2 * local_base(h, 0))


def test_reduce_over_a_slice_of_the_mesh(mesh: ProcMesh) -> None:
    row = mesh.slice(host=1)
    with row.activate():
        r = (torch.arange(3) + row.rank("gpu")).reduce("gpu", "sum")
    assert torch.equal(danaus.inspect(r, gpu=1), torch.arange(3) * 2 + 1)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"dims": "rack"}, KeyError, "'rack' not found"),
        ({"dims": ("gpu", "gpu")}, ValueError, "same dimension twice"),
        ({"dims": ("gpu", "host"), "reduction": "stack"}, ValueError, "one dimension only"),
        ({"dims": ("gpu", "host"), "scatter": True}, ValueError, "one dimension only"),
        ({"dims": "gpu", "reduction": "mean"}, ValueError, "'mean' not supported"),
        ({"dims": "gpu", "scatter": True, "shape": (3, 2)}, TypeError, "outermost dimension"),
        ({"dims": "gpu", "reduction": "band"}, TypeError, "integer or bool"),
        ({"dims": "gpu", "reduction": "avg", "dtype": torch.long}, TypeError, "floating"),
        ({"dims": "gpu", "reduction": "stack", "inplace": True}, ValueError, "change the shape"),
    ],
)
def test_reduce_rejects_bad_arguments_before_sending(
    mesh: ProcMesh, kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    shape = kwargs.pop("shape", (2, 3))
    dtype = kwargs.pop("dtype", torch.float32)
    inplace = kwargs.pop("inplace", False)
    with mesh.activate():
        t = torch.ones(shape, dtype=dtype)
        with pytest.raises(error, match=match):
            if inplace:
                t.reduce_(**kwargs)
            else:
                t.reduce(**kwargs)


def test_reduce_of_a_tensor_requiring_grad_is_an_error(mesh: ProcMesh) -> None:
    with mesh.activate():
        w = torch.ones(3, requires_grad=True)
        with pytest.raises(ValueError, match="autograd"):
            w.reduce("gpu")


def test_a_pytree_of_one_dtype_reduces_as_one_bucket_with_mixed_dtypes_apart(
    mesh: ProcMesh,
) -> None:
    with mesh.activate():
        grads = [base(mesh), base(mesh).reshape(2, 3) * 2, base(mesh).long()]
        out = danaus.reduce(grads, "gpu", "sum")
        danaus.reduce_(grads[:2], ("host", "gpu"), "avg")
    for h, g in COORDS:
        both = local_base(h, 0) + local_base(h, 1)
        got = danaus.inspect(out, host=h, gpu=g)
        assert torch.equal(got[0], both)
        assert torch.equal(got[1], (both * 2).reshape(2, 3))
        assert torch.equal(got[2], both.long())
        every = sum(local_base(hh, gg) for hh, gg in COORDS) / 4
        avg = danaus.inspect(grads[:2], host=h, gpu=g)
        assert torch.allclose(avg[0], every) and torch.allclose(avg[1], (every * 2).reshape(2, 3))


def test_a_failed_member_of_a_bucket_fails_the_whole_bucket(mesh: ProcMesh) -> None:
    with mesh.activate():
        x = base(mesh)
        bad = x[(mesh.rank("gpu") * 10).reshape(1)]  # fails on gpu 1
        out = danaus.reduce([x, bad], "gpu", "sum")
        later = x.reduce("gpu", "sum")
    for g in range(2):
        for t in out:
            with pytest.raises(danaus.RemoteTensorError) as info:
                danaus.inspect(t, gpu=g)
            assert info.value.ranks == [1]
    assert torch.equal(danaus.inspect(later), local_base(0, 0) + local_base(0, 1))
