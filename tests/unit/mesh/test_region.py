"""Region, Monarch's name for labels over a slice of base ranks (``danaus._mesh.shape``)."""

from __future__ import annotations

import pickle

import pytest

from danaus._mesh import Extent, Point, Region, Shape, Slice


def _two_by_two_of_four_by_two() -> Region:
    # Base ranks 0..7 as x=4, y=2; the region is x in 1..2: base ranks 2, 3, 4, 5.
    return Shape(["x", "y"], Slice.new_row_major([4, 2])).select("x", slice(1, 3)).region


def test_point_of_base_rank_maps_base_ranks_to_points_of_the_region() -> None:
    region = _two_by_two_of_four_by_two()
    extent = Extent(["x", "y"], [2, 2])
    for i, base in enumerate([2, 3, 4, 5]):
        assert region.point_of_base_rank(base) == Point(i, extent)
    assert dict(region.point_of_base_rank(4)) == {"x": 1, "y": 0}
    for outside in (0, 1, 6, 7):
        with pytest.raises(ValueError, match=f"rank {outside} is not in"):
            region.point_of_base_rank(outside)


def test_a_region_is_its_shape_under_another_name() -> None:
    region = _two_by_two_of_four_by_two()
    assert region.labels == ["x", "y"]
    assert region.slice() == Slice(2, [2, 2], [2, 1])
    assert region.as_shape() == Shape(["x", "y"], Slice(2, [2, 2], [2, 1]))
    assert region.as_shape().region == region
    assert region.extent == Extent(["x", "y"], [2, 2])


def test_an_extent_is_the_region_of_base_ranks_from_zero() -> None:
    region = Extent(["hosts", "gpus"], [2, 3]).region
    assert region == Region(["hosts", "gpus"], Slice.new_row_major([2, 3]))
    assert dict(region.point_of_base_rank(5)) == {"hosts": 1, "gpus": 2}


def test_regions_are_values() -> None:
    region = _two_by_two_of_four_by_two()
    assert pickle.loads(pickle.dumps(region)) == region
    assert hash(Region(["x", "y"], Slice(2, [2, 2], [2, 1]))) == hash(region)
    assert region != Region(["x", "z"], Slice(2, [2, 2], [2, 1]))
    assert region != region.as_shape()  # not a Shape, though it holds the same
    with pytest.raises(AttributeError, match="immutable"):
        region.labels = ["a", "b"]  # type: ignore[misc]
    assert "Region(labels=['x', 'y']" in repr(region)


def test_a_region_needs_one_label_per_dimension_of_its_slice() -> None:
    with pytest.raises(ValueError, match="one label per dimension"):
        Region(["x"], Slice.new_row_major([2, 2]))
    with pytest.raises(TypeError, match="needs a Slice"):
        Region(["x"], [0, 1])  # type: ignore[arg-type]
