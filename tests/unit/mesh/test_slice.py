"""Slice: strided row-major views of global ranks."""

from __future__ import annotations

import pickle

import pytest

from danaus._mesh import NDSlice, Slice


def test_new_row_major_lays_out_ranks_densely_last_dim_fastest() -> None:
    s = Slice.new_row_major([2, 3, 4])
    assert (s.offset, s.sizes, s.strides, s.ndim) == (0, [2, 3, 4], [12, 4, 1], 3)
    assert len(s) == 24
    assert list(s) == list(range(24))


def test_keyword_and_positional_construction_are_equal_and_hash_alike() -> None:
    a = Slice(offset=0, sizes=[2, 3], strides=[3, 1])
    b = Slice(0, (2, 3), (3, 1))
    assert a == b
    assert hash(a) == hash(b)
    assert a != Slice(offset=1, sizes=[2, 3], strides=[3, 1])
    assert a != (0, (2, 3), (3, 1))


def test_repr_reads_like_the_constructor_call() -> None:
    assert repr(Slice(1, [3], [2])) == "Slice(offset=1, sizes=[3], strides=[2])"


def test_strided_slice_iterates_in_row_major_order_of_coordinates() -> None:
    s = Slice(offset=1, sizes=[2, 2], strides=[6, 2])
    assert list(s) == [1, 3, 7, 9]
    assert [s[i] for i in range(4)] == [1, 3, 7, 9]
    assert [s.get(i) for i in range(4)] == [1, 3, 7, 9]


def test_getitem_refuses_negative_and_out_of_range_positions_naming_the_size() -> None:
    s = Slice(offset=1, sizes=[2, 2], strides=[6, 2])
    with pytest.raises(IndexError, match="4 ranks"):
        s[4]
    with pytest.raises(IndexError, match="-1"):
        s[-1]
    with pytest.raises(TypeError, match="'0'"):
        s.get("0")  # type: ignore[arg-type]


def test_index_coordinates_and_nditem_agree_on_a_strided_slice() -> None:
    s = Slice(offset=1, sizes=[2, 2], strides=[6, 2])
    assert s.index(7) == 2
    assert s.coordinates(7) == [1, 0]
    assert s.nditem([1, 0]) == 7
    assert s.coordinates(9) == [1, 1]


@pytest.mark.parametrize("rank", [0, 2, 5, 11, 100])
def test_index_and_coordinates_of_a_rank_outside_the_slice_raise_value_error(rank: int) -> None:
    s = Slice(offset=1, sizes=[2, 2], strides=[6, 2])
    assert rank not in s
    with pytest.raises(ValueError, match=f"rank {rank} is not in"):
        s.index(rank)
    with pytest.raises(ValueError, match=f"rank {rank} is not in"):
        s.coordinates(rank)


def test_nditem_checks_the_number_and_range_of_coordinates() -> None:
    s = Slice.new_row_major([2, 3])
    with pytest.raises(ValueError, match=r"expected 2 coordinates.*\[1\]"):
        s.nditem([1])
    with pytest.raises(IndexError, match="size is 3"):
        s.nditem([0, 3])
    with pytest.raises(IndexError, match="size is 2"):
        s.nditem([-1, 0])


def test_zero_size_dimension_makes_an_empty_slice() -> None:
    s = Slice(offset=3, sizes=[2, 0], strides=[4, 1])
    assert len(s) == 0
    assert list(s) == []
    assert 3 not in s
    with pytest.raises(IndexError, match="0 ranks"):
        s.get(0)
    with pytest.raises(ValueError, match="not in"):
        s.index(3)


def test_zero_dimensional_slice_holds_exactly_its_offset() -> None:
    s = Slice(offset=5, sizes=[], strides=[])
    assert len(s) == 1
    assert list(s) == [5]
    assert s.coordinates(5) == []
    assert s.nditem([]) == 5
    assert s.index(5) == 0


def test_non_nested_but_injective_layout_still_decodes_every_rank() -> None:
    # Ranks 0, 3, 2, 5, 4, 7: no stride dominates the other's span.
    s = Slice(offset=0, sizes=[3, 2], strides=[2, 3])
    assert list(s) == [0, 3, 2, 5, 4, 7]
    for pos, rank in enumerate(s):
        assert s.index(rank) == pos
        assert s.nditem(s.coordinates(rank)) == rank
    with pytest.raises(ValueError, match="rank 1 is not in"):
        s.index(1)


def test_a_layout_that_names_a_rank_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="names rank 0 twice"):
        Slice(offset=0, sizes=[2], strides=[0])
    with pytest.raises(ValueError, match="twice"):
        Slice(offset=0, sizes=[3, 2], strides=[1, 2])


def test_constructor_rejects_mismatched_lengths_negative_and_non_int_values() -> None:
    with pytest.raises(ValueError, match=r"sizes \[2, 3\] and strides \[1\]"):
        Slice(0, [2, 3], [1])
    with pytest.raises(ValueError, match="-1"):
        Slice(0, [-1], [1])
    with pytest.raises(ValueError, match="-2"):
        Slice(-2, [1], [1])
    with pytest.raises(TypeError, match="'a'"):
        Slice(0, ["a"], [1])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="bool"):
        Slice(True, [1], [1])
    with pytest.raises(TypeError, match=r"2\.5"):
        Slice(0, [2.5], [1])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="sequence of ints"):
        Slice(0, 3, [1])  # type: ignore[arg-type]


def test_slice_is_immutable() -> None:
    s = Slice.new_row_major([2])
    with pytest.raises(AttributeError, match="immutable"):
        s.offset = 3  # type: ignore[misc]
    with pytest.raises(AttributeError, match="immutable"):
        s._offset = 3


def test_slice_pickles_to_an_equal_slice() -> None:
    s = Slice(offset=1, sizes=[2, 2], strides=[6, 2])
    t = pickle.loads(pickle.dumps(s))
    assert t == s
    assert list(t) == list(s)


def test_ndslice_is_another_name_for_slice() -> None:
    assert NDSlice is Slice


@pytest.mark.parametrize(
    ("ranks", "expected"),
    [
        ([1, 3, 5], [Slice(1, [3], [2])]),
        ([0, 1, 2, 7, 9], [Slice(0, [3], [1]), Slice(7, [2], [2])]),
        ([], []),
        ([4], [Slice(4, [1], [1])]),
        ([3, 3], [Slice(3, [1], [1]), Slice(3, [1], [1])]),
        ([5, 3, 1], [Slice(5, [1], [1]), Slice(3, [1], [1]), Slice(1, [1], [1])]),
        ([0, 4, 8, 9, 10], [Slice(0, [2], [4]), Slice(8, [3], [1])]),
    ],
)
def test_from_list_covers_the_ranks_in_order_with_the_fewest_slices(
    ranks: list[int], expected: list[Slice]
) -> None:
    got = Slice.from_list(ranks)
    assert got == expected
    assert [r for s in got for r in s] == ranks


def test_from_list_rejects_negative_and_non_int_ranks() -> None:
    with pytest.raises(ValueError, match="-1"):
        Slice.from_list([0, -1])
    with pytest.raises(TypeError, match="'x'"):
        Slice.from_list([0, "x"])  # type: ignore[list-item]
