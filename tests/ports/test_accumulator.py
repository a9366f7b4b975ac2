"""``Accumulator``: a client-side left fold over an endpoint's replies (issue 6)."""

from __future__ import annotations

import operator
from typing import Any

import pytest

from danaus.actor import Accumulator, Actor, ActorError, ProcMesh, current_rank, endpoint

from .conftest import TIMEOUT


class Valued(Actor):
    @endpoint
    def value(self, scale: int, *, offset: int = 0) -> int:
        return current_rank().rank * scale + offset

    @endpoint
    def fail_on(self, rank: int) -> int:
        if current_rank().rank == rank:
            raise ArithmeticError(f"rank {rank} cannot")
        return 1


@pytest.fixture(scope="module")
def valued(procs: ProcMesh) -> Any:
    mesh = procs.spawn("valued", Valued)
    mesh.initialized.get(timeout=TIMEOUT)
    return mesh


def test_accumulate_folds_the_replies_of_every_actor(valued) -> None:
    total = Accumulator(valued.value, 100, operator.add).accumulate(10).get(timeout=TIMEOUT)
    assert total == 100 + 0 + 10


def test_accumulate_forwards_positional_and_keyword_arguments(valued) -> None:
    acc = Accumulator(valued.value, [], lambda state, x: [*state, x])
    assert sorted(acc.accumulate(3, offset=1).get(timeout=TIMEOUT)) == [1, 4]


def test_accumulate_is_a_left_fold_starting_from_the_identity(valued) -> None:
    nested = Accumulator(valued.value, "identity", lambda state, x: (state, x))
    result = nested.accumulate(5).get(timeout=TIMEOUT)
    # combine(combine(identity, r1), r2), in arrival order
    (inner, second) = result
    (identity, first) = inner
    assert identity == "identity"
    assert sorted([first, second]) == [0, 5]


def test_accumulate_over_an_empty_mesh_is_the_identity(valued) -> None:
    # slice() refuses an empty range (as Monarch does); an empty mesh is still a mesh
    empty = valued._new_with_shape(valued._shape.select("gpus", slice(0, 0)))
    assert len(empty) == 0
    assert Accumulator(empty.value, 42, operator.add).accumulate(1).get(timeout=TIMEOUT) == 42


def test_accumulate_over_a_slice_folds_only_its_actors(valued) -> None:
    one = valued.slice(gpus=1)
    assert Accumulator(one.value, 0, operator.add).accumulate(7).get(timeout=TIMEOUT) == 0
    # rank is within the mesh messaged: the slice's only actor is its rank 0


def test_accumulate_raises_the_actor_error_of_a_rank_that_raised(valued) -> None:
    with pytest.raises(ActorError) as info:
        Accumulator(valued.fail_on, 0, operator.add).accumulate(1).get(timeout=TIMEOUT)
    assert isinstance(info.value.exception, ArithmeticError)


def test_accumulator_needs_an_endpoint() -> None:
    with pytest.raises(TypeError):
        Accumulator(lambda: 1, 0, operator.add)  # type: ignore[arg-type]
