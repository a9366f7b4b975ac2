"""Extent (named sizes) and Point (a rank's named coordinates)."""

from __future__ import annotations

import pickle
from collections.abc import Mapping

import pytest

from danaus._mesh import Extent, Point


def test_extent_is_an_ordered_mapping_of_label_to_size() -> None:
    e = Extent(["hosts", "gpus"], [2, 4])
    assert isinstance(e, Mapping)
    assert e.labels == ["hosts", "gpus"]
    assert e.sizes == [2, 4]
    assert e.nelements == 8
    assert len(e) == 2
    assert list(e) == ["hosts", "gpus"]
    assert dict(e) == {"hosts": 2, "gpus": 4}
    assert e["gpus"] == 4
    assert "hosts" in e
    assert "procs" not in e


def test_extent_repr_shows_its_dict() -> None:
    assert repr(Extent(["hosts", "gpus"], [2, 4])) == "Extent({'hosts': 2, 'gpus': 4})"


def test_extents_are_equal_only_with_same_labels_and_sizes_in_same_order() -> None:
    e = Extent(["hosts", "gpus"], [2, 4])
    assert e == Extent(("hosts", "gpus"), (2, 4))
    assert hash(e) == hash(Extent(["hosts", "gpus"], [2, 4]))
    assert e != Extent(["gpus", "hosts"], [4, 2])
    assert e != Extent(["hosts", "gpus"], [2, 3])
    assert e != {"hosts": 2, "gpus": 4}


def test_empty_extent_has_one_element() -> None:
    e = Extent([], [])
    assert e.nelements == 1
    assert len(e) == 0
    assert repr(e) == "Extent({})"


def test_extent_rejects_duplicate_labels_mismatched_lengths_and_bad_values() -> None:
    with pytest.raises(ValueError, match="Duplicate dimension name 'a'"):
        Extent(["a", "a"], [1, 2])
    with pytest.raises(ValueError, match=r"one size per label.*\['a'\].*\[1, 2\]"):
        Extent(["a"], [1, 2])
    with pytest.raises(ValueError, match="-3"):
        Extent(["a"], [-3])
    with pytest.raises(TypeError, match="'2'"):
        Extent(["a"], ["2"])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="got 3 in"):
        Extent([3], [2])  # type: ignore[list-item]
    with pytest.raises(TypeError, match=r"Probably you meant \['hosts'\]"):
        Extent("hosts", [2])


def test_extent_lookup_of_unknown_label_names_the_valid_labels() -> None:
    e = Extent(["hosts", "gpus"], [2, 4])
    with pytest.raises(KeyError, match=r"'gpu'.*\['hosts', 'gpus'\].*Probably you meant 'gpus'"):
        e["gpu"]


def test_extent_is_immutable_and_pickles() -> None:
    e = Extent(["hosts", "gpus"], [2, 4])
    with pytest.raises(AttributeError, match="immutable"):
        e._labels = ("x",)
    assert pickle.loads(pickle.dumps(e)) == e
    assert e.labels is not e.labels  # a fresh list each time: callers cannot mutate it


def test_point_decomposes_its_rank_row_major_over_the_extent() -> None:
    e = Extent(["hosts", "gpus"], [2, 4])
    p = Point(6, e)
    assert isinstance(p, Mapping)
    assert dict(p) == {"hosts": 1, "gpus": 2}
    assert p.rank == 6
    assert p.extent == e
    assert p.size("gpus") == 4
    assert len(p) == 2
    assert list(p) == ["hosts", "gpus"]


def test_point_str_and_repr_show_coordinate_over_size() -> None:
    p = Point(3, Extent(["hosts", "gpus"], [2, 4]))
    assert str(p) == "{'hosts': 0/2, 'gpus': 3/4}"
    assert repr(p) == "Point({'hosts': 0/2, 'gpus': 3/4})"


def test_points_are_equal_by_rank_and_extent() -> None:
    e = Extent(["hosts", "gpus"], [2, 4])
    assert Point(3, e) == Point(3, Extent(["hosts", "gpus"], [2, 4]))
    assert hash(Point(3, e)) == hash(Point(3, Extent(["hosts", "gpus"], [2, 4])))
    assert Point(3, e) != Point(4, e)
    assert Point(0, e) != Point(0, Extent(["hosts", "gpus"], [2, 5]))
    assert Point(3, e) != {"hosts": 0, "gpus": 3}


@pytest.mark.parametrize("rank", [8, -1, 100])
def test_point_rank_outside_the_extent_raises_index_error_naming_its_size(rank: int) -> None:
    with pytest.raises(IndexError, match=f"rank {rank} out of range.*8 elements"):
        Point(rank, Extent(["hosts", "gpus"], [2, 4]))


def test_point_needs_an_extent_and_suggests_building_one() -> None:
    with pytest.raises(TypeError, match=r"Probably you meant Extent\(\['hosts'\], \[2\]\)"):
        Point(0, {"hosts": 2})  # type: ignore[arg-type]


def test_point_lookup_of_unknown_label_raises_key_error() -> None:
    p = Point(0, Extent(["hosts"], [2]))
    with pytest.raises(KeyError, match="Probably you meant 'hosts'"):
        p["host"]
    with pytest.raises(KeyError, match="'gpus'"):
        p.size("gpus")


def test_point_in_zero_dimensional_extent_has_no_coordinates() -> None:
    p = Point(0, Extent([], []))
    assert dict(p) == {}
    assert str(p) == "{}"


def test_point_is_immutable_and_pickles() -> None:
    p = Point(5, Extent(["hosts", "gpus"], [2, 4]))
    with pytest.raises(AttributeError, match="immutable"):
        p._rank = 1
    q = pickle.loads(pickle.dumps(p))
    assert q == p
    assert str(q) == str(p)
