"""``danaus.function_resolvers`` and ``remote``'s ``propagate`` strings."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import danaus
from danaus.actor import ProcMesh
from danaus.common.function import ResolvableFunctionFromPath, resolvable_function, resolvers

from . import helpers
from .conftest import COORDS, REPLY_TIMEOUT, base, local_base, torch

pytestmark = pytest.mark.torch


@pytest.fixture
def registry_resolver() -> Iterator[None]:
    danaus.function_resolvers.insert(0, helpers.resolve_registered)
    try:
        yield
    finally:
        danaus.function_resolvers.remove(helpers.resolve_registered)


def test_function_resolvers_is_the_list_remote_consults() -> None:
    assert danaus.function_resolvers is resolvers
    assert len(resolvers) == 3  # torch operators, path strings, callables


def test_the_default_resolvers_keep_functions_paths_and_torch_ops() -> None:
    assert resolvable_function(torch.ops.aten.add.Tensor) == ResolvableFunctionFromPath(
        "torch.ops.aten.add.Tensor"
    )
    assert resolvable_function(torch.ops.aten.add.Tensor).resolve() is torch.ops.aten.add.Tensor
    by_name = resolvable_function("tests.tensor.helpers.add_and_scale").resolve()
    # (pytest may have imported this package under another name: compare the code)
    assert by_name.__code__.co_filename == helpers.add_and_scale.__code__.co_filename
    assert resolvable_function(helpers.add_and_scale).resolve() is helpers.add_and_scale
    # a @remote-decorated module-level function goes by its path; the worker calls the function
    from danaus.builtins.random import set_manual_seed_remote

    path = resolvable_function(set_manual_seed_remote._remote_impl)
    assert path == ResolvableFunctionFromPath("danaus._tensor.builtins.set_manual_seed_remote")
    assert path.resolve() is set_manual_seed_remote._remote_impl


def test_an_inserted_resolver_turns_a_new_kind_of_target_into_a_worker_function(
    mesh: ProcMesh, registry_resolver: None
) -> None:
    triple = danaus.remote(helpers.Registered("triple"), propagate=lambda x: x)
    with mesh.activate():
        out = triple(base(mesh))
        values = triple.call(base(mesh)).get(timeout=REPLY_TIMEOUT)
    for h, g in COORDS:
        assert torch.equal(danaus.inspect(out, host=h, gpu=g), local_base(h, g) * 3)
    assert torch.equal(values.item(host=1, gpu=0), local_base(1, 0) * 3)


def test_a_resolver_inserted_first_wins_over_the_defaults(mesh: ProcMesh) -> None:
    def to_triple(target: object) -> helpers.RegistryFunction | None:
        return helpers.RegistryFunction("triple") if target is helpers.add_and_scale else None

    resolvers.insert(0, to_triple)
    try:
        fn = danaus.remote(helpers.add_and_scale, propagate=lambda x: x)
        with mesh.activate():
            out = fn(base(mesh))
        assert torch.equal(danaus.inspect(out), local_base(0, 0) * 3)
    finally:
        resolvers.remove(to_triple)


def test_an_unsupported_target_raises_value_error_naming_it() -> None:
    unsupported = "Unsupported target for a remote call"
    with pytest.raises(ValueError, match=rf"{unsupported}: Registered\('x'\)"):
        danaus.remote(helpers.Registered("x"))
    with pytest.raises(ValueError, match="Unsupported target for a remote call: 'nodots'"):
        danaus.remote("nodots")
    with pytest.raises(ValueError, match="Unsupported target for a remote call: 42"):
        danaus.remote(42)


def test_a_resolver_that_returns_no_resolvable_is_named(registry_resolver: None) -> None:
    def broken(target: object) -> object:
        return "not a resolvable"

    resolvers.insert(0, broken)
    try:
        with pytest.raises(TypeError, match=r"function resolver .*broken.* no resolve\(\)"):
            danaus.remote(helpers.add_and_scale)
    finally:
        resolvers.remove(broken)


def test_propagate_inspect_returns_none_and_still_runs_the_function(mesh: ProcMesh) -> None:
    fill = danaus.remote(helpers.double_in_place, propagate="inspect")
    with mesh.activate():
        x = base(mesh)
        assert fill(x) is None
        fill(x)
    for h, g in COORDS:
        assert torch.equal(danaus.inspect(x, host=h, gpu=g), local_base(h, g) * 4)


def test_propagate_cached_runs_the_function_on_meta_tensors_and_mocked_is_refused(
    mesh: ProcMesh,
) -> None:
    cached = danaus.remote(helpers.split_halves, propagate="cached")
    mocked = danaus.remote(helpers.split_halves, propagate="mocked")
    with mesh.activate():
        _, b = cached(base(mesh))
        with pytest.raises(NotImplementedError, match="mocked propagation"):
            mocked(base(mesh))
    assert torch.equal(danaus.inspect(b, host=1, gpu=1), local_base(1, 1)[3:])


def test_a_bad_propagate_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match=r"propagate='guess'.* must be None, one of"):
        danaus.remote(helpers.add_and_scale, propagate="guess")
