"""Shape: labelled dimensions over a Slice, cut with at/select/index."""

from __future__ import annotations

import pickle

import pytest

from danaus._mesh import Extent, Shape, Slice


@pytest.fixture
def shape() -> Shape:
    """A 2x3x4 row-major shape: ranks 0..23, strides (12, 4, 1)."""
    return Shape(["a", "b", "c"], Slice.new_row_major([2, 3, 4]))


def test_shape_reports_labels_slice_extent_and_ranks(shape: Shape) -> None:
    assert shape.labels == ["a", "b", "c"]
    assert shape.ndslice == Slice(0, [2, 3, 4], [12, 4, 1])
    assert shape.extent == Extent(["a", "b", "c"], [2, 3, 4])
    assert len(shape) == 24
    assert shape.ranks() == list(range(24))
    assert shape.coordinates(17) == {"a": 1, "b": 1, "c": 1}


def test_at_removes_the_dim_and_moves_the_offset_by_index_times_stride(shape: Shape) -> None:
    cut = shape.at("b", 2)
    assert cut.labels == ["a", "c"]
    assert cut.ndslice == Slice(offset=8, sizes=[2, 4], strides=[12, 1])
    assert cut.ranks() == [8, 9, 10, 11, 20, 21, 22, 23]


def test_select_keeps_the_dim_and_multiplies_its_stride_by_the_step(shape: Shape) -> None:
    cut = shape.select("c", slice(1, 4, 2))
    assert cut.labels == ["a", "b", "c"]
    assert cut.ndslice == Slice(offset=1, sizes=[2, 3, 2], strides=[12, 4, 2])
    assert cut.ranks()[:4] == [1, 3, 5, 7]


@pytest.mark.parametrize(
    ("selector", "offset", "size"),
    [
        (slice(None), 0, 3),
        (slice(1, None), 4, 2),
        (slice(1, 100), 4, 2),  # stop is clamped like list slicing
        (slice(-2, None), 4, 2),  # negative start counts from the end
        (slice(None, -1), 0, 2),
        (slice(0, 3, 5), 0, 1),
    ],
)
def test_select_bounds_follow_python_list_slicing(
    shape: Shape, selector: slice, offset: int, size: int
) -> None:
    cut = shape.select("b", selector)
    assert cut.ndslice.offset == offset
    assert cut.ndslice.sizes == [2, size, 4]
    assert cut.ranks() == [
        r for r in shape.ranks() if shape.coordinates(r)["b"] in range(3)[selector]
    ]


def test_select_of_an_empty_range_gives_an_empty_shape(shape: Shape) -> None:
    cut = shape.select("b", slice(5, 10))
    assert cut.ndslice.sizes == [2, 0, 4]
    assert len(cut) == 0
    assert cut.ranks() == []


def test_index_removes_every_given_dim(shape: Shape) -> None:
    cut = shape.index(a=1, c=3)
    assert cut.labels == ["b"]
    assert cut.ndslice == Slice(offset=15, sizes=[3], strides=[4])
    assert cut.ranks() == [15, 19, 23]
    assert shape.index() == shape


def test_cuts_keep_global_ranks_so_coordinates_are_local_to_the_cut(shape: Shape) -> None:
    cut = shape.at("a", 1).select("c", slice(2, None))
    assert cut.ranks() == [14, 15, 18, 19, 22, 23]
    assert cut.coordinates(19) == {"b": 1, "c": 1}
    with pytest.raises(ValueError, match="rank 13 is not in"):
        cut.coordinates(13)


def test_unity_is_the_zero_dimensional_shape_of_rank_zero() -> None:
    u = Shape.unity()
    assert u.labels == []
    assert u.ndslice == Slice(0, [], [])
    assert len(u) == 1
    assert u.ranks() == [0]
    assert u.extent == Extent([], [])


def test_unknown_label_raises_type_error_listing_the_labels(shape: Shape) -> None:
    with pytest.raises(TypeError, match=r"'d'.*\['a', 'b', 'c'\]"):
        shape.at("d", 0)
    with pytest.raises(TypeError, match=r"'bb'.*Probably you meant 'b'"):
        shape.select("bb", slice(None))
    with pytest.raises(TypeError, match="'x'"):
        shape.index(x=0)


@pytest.mark.parametrize("index", [3, -1, 10])
def test_at_out_of_range_or_negative_raises_index_error_naming_the_size(
    shape: Shape, index: int
) -> None:
    with pytest.raises(IndexError, match=f"index {index} out of range.*size 3"):
        shape.at("b", index)


def test_at_refuses_a_non_int_index(shape: Shape) -> None:
    with pytest.raises(TypeError, match="'1'"):
        shape.at("b", "1")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="bool"):
        shape.at("b", True)


@pytest.mark.parametrize("step", [0, -1])
def test_select_refuses_zero_or_negative_steps(shape: Shape, step: int) -> None:
    with pytest.raises(ValueError, match=f"step must be positive.*{step}"):
        shape.select("b", slice(None, None, step))


def test_select_refuses_a_non_slice_and_suggests_at(shape: Shape) -> None:
    with pytest.raises(TypeError, match=r"got 1\. Probably you meant at\('b', 1\)"):
        shape.select("b", 1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="bounds must be ints"):
        shape.select("b", slice("x", None))


def test_constructor_checks_labels_against_the_slice() -> None:
    with pytest.raises(ValueError, match=r"one label per dimension.*\['a'\]"):
        Shape(["a"], Slice.new_row_major([2, 3]))
    with pytest.raises(ValueError, match="Duplicate dimension name 'a'"):
        Shape(["a", "a"], Slice.new_row_major([2, 3]))
    with pytest.raises(TypeError, match=r"Probably you meant Slice\.new_row_major"):
        Shape(["a"], [2])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"Probably you meant \['a'\]"):
        Shape("a", Slice.new_row_major([2]))


def test_shape_has_value_semantics(shape: Shape) -> None:
    same = Shape(("a", "b", "c"), Slice(0, [2, 3, 4], [12, 4, 1]))
    assert shape == same
    assert hash(shape) == hash(same)
    assert shape != Shape(["a", "b", "x"], Slice.new_row_major([2, 3, 4]))
    assert shape != shape.at("a", 0)
    with pytest.raises(AttributeError, match="immutable"):
        shape._labels = ()


def test_shape_pickles_and_reprs_as_its_constructor(shape: Shape) -> None:
    cut = shape.select("c", slice(1, 4, 2))
    assert pickle.loads(pickle.dumps(cut)) == cut
    assert repr(shape.at("a", 1).at("b", 0)) == (
        "Shape(labels=['c'], slice=Slice(offset=12, sizes=[4], strides=[1]))"
    )
