"""The tensor engine's pure parts: how ``remote``'s target becomes what a worker calls
(``function_resolvers``), and the error a fetch raises for a failed op."""

from __future__ import annotations

import os.path
import pickle
from collections.abc import Iterator
from typing import Any

import pytest

from danaus._tensor import function
from danaus._tensor.errors import Failure, RemoteTensorError
from danaus._tensor.function import (
    ResolvableFunctionFromPath,
    ResolvableFunctionFromValue,
    resolvable_function,
    resolve_function,
    target_name,
)


@pytest.fixture
def resolvers() -> Iterator[list[Any]]:
    """The public list, restored after the test."""
    saved = list(function.resolvers)
    yield function.resolvers
    function.resolvers[:] = saved


def _local(x: int) -> int:
    return x + 1


def test_a_path_string_resolves_to_the_function_it_names() -> None:
    r = resolvable_function("os.path.join")
    assert r == ResolvableFunctionFromPath("os.path.join") and str(r) == "os.path.join"
    assert r.resolve() is os.path.join
    assert pickle.loads(pickle.dumps(r)) == r  # what travels to the workers
    assert resolve_function("os.path.basename") is os.path.basename  # older clients' form


def test_a_callable_travels_by_value_and_resolves_to_itself() -> None:
    r = resolvable_function(_local)
    assert isinstance(r, ResolvableFunctionFromValue) and r.resolve() is _local
    assert str(r) == "_local" and target_name(r) == "_local"
    assert resolve_function(r)(1) == 2
    assert resolve_function(_local) is _local  # a plain function is taken as is


@pytest.mark.parametrize("target", [3, "nodots", ".", int])
def test_an_unsupported_target_is_refused_naming_it_and_what_remote_takes(target: Any) -> None:
    with pytest.raises(ValueError, match=r"Unsupported target for a remote call: .*'package"):
        resolvable_function(target)


def test_a_resolver_inserted_first_wins_and_a_bad_one_is_named(resolvers: list[Any]) -> None:
    seen: list[Any] = []

    def mine(target: Any) -> Any:
        seen.append(target)
        return ResolvableFunctionFromPath("os.path.dirname") if target == "special" else None

    resolvers.insert(0, mine)
    assert resolvable_function("special").resolve() is os.path.dirname
    assert resolvable_function("os.path.join").resolve() is os.path.join  # falls through
    assert seen == ["special", "os.path.join"]

    def broken(target: Any) -> Any:
        return "not a resolvable"

    resolvers.insert(0, broken)
    with pytest.raises(TypeError, match=r"turned 'x\.y' into 'not a resolvable'.*resolve"):
        resolvable_function("x.y")


def test_a_resolvable_is_passed_through_untouched(resolvers: list[Any]) -> None:
    resolvers.clear()  # not even asked
    r = ResolvableFunctionFromPath("os.path.join")
    assert resolvable_function(r) is r


def test_target_names_read_well_in_errors() -> None:
    assert target_name("pkg.mod.fn") == "pkg.mod.fn"
    assert target_name(ResolvableFunctionFromPath("a.b")) == "a.b"
    assert target_name(_local) == "_local"
    assert target_name(3) == "3"


def test_a_remote_tensor_error_names_the_failed_op_where_and_why_and_pickles() -> None:
    failure = Failure("aten.mm", 3, "RuntimeError", "shapes differ", "Traceback...\n  line 1")
    err = RemoteTensorError(failure, fetched_rank=5, labels={"hosts": 1, "gpus": 1})
    text = str(err)
    assert "depends on op aten.mm which failed on rank 3: RuntimeError: shapes differ" in text
    assert "{'hosts': 1, 'gpus': 1}" in text and "Remote traceback (rank 3)" in text
    assert (err.op, err.ranks, err.remote_traceback) == ("aten.mm", [3], failure.traceback)
    again = pickle.loads(pickle.dumps(err))
    assert str(again) == text and again.failure == failure
    assert "rank 5" in str(RemoteTensorError(failure, 5, {}))
