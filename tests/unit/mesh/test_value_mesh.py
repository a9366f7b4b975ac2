"""ValueMesh: one value per rank, sliced like any mesh."""

from __future__ import annotations

import pickle

import pytest

from danaus._mesh import Extent, Point, Shape, Slice, ValueMesh


def grid(labels: list[str], sizes: list[int]) -> Shape:
    return Shape(labels, Slice.new_row_major(sizes))


@pytest.fixture
def vm() -> ValueMesh[str]:
    """hosts x gpus = 2 x 4, values 'v0'..'v7' in rank order."""
    return ValueMesh(grid(["hosts", "gpus"], [2, 4]), [f"v{i}" for i in range(8)])


def test_values_are_held_in_local_rank_order(vm: ValueMesh[str]) -> None:
    assert len(vm) == 8
    assert vm.values() == [f"v{i}" for i in range(8)]
    assert vm.get(5) == "v5"
    assert vm.sizes == {"hosts": 2, "gpus": 4}


@pytest.mark.parametrize("index", [8, -1])
def test_get_outside_the_local_indices_raises_value_error(vm: ValueMesh[str], index: int) -> None:
    with pytest.raises(ValueError, match=f"index {index} out of range.*0..7"):
        vm.get(index)


def test_constructor_needs_one_value_per_rank_and_a_shape() -> None:
    with pytest.raises(ValueError, match="has 4 ranks but got 3 values"):
        ValueMesh(grid(["gpus"], [4]), [0, 1, 2])
    with pytest.raises(TypeError, match="Probably you meant Shape"):
        ValueMesh({"gpus": 4}, [0, 1, 2, 3])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must be a sequence, got 4"):
        ValueMesh(grid(["gpus"], [4]), 4)  # type: ignore[arg-type]


def test_slice_selects_the_values_of_the_selected_ranks(vm: ValueMesh[str]) -> None:
    cut = vm.slice(gpus=slice(1, None, 2))
    assert isinstance(cut, ValueMesh)
    assert cut.values() == ["v1", "v3", "v5", "v7"]
    assert cut.sizes == {"hosts": 2, "gpus": 2}
    assert vm.slice(hosts=1).values() == ["v4", "v5", "v6", "v7"]


def test_slices_of_slices_select_the_same_values_as_the_composed_slice(
    vm: ValueMesh[str],
) -> None:
    twice = vm.slice(gpus=slice(1, None)).slice(gpus=slice(1, 3), hosts=1)
    assert twice.values() == vm.slice(gpus=slice(2, 4), hosts=1).values() == ["v6", "v7"]


def test_split_rename_and_flatten_keep_the_values_in_order(vm: ValueMesh[str]) -> None:
    s = vm.split(gpus=("x", "y"), y=2)
    assert s.sizes == {"hosts": 2, "x": 2, "y": 2}
    assert s.values() == vm.values()
    assert s.item(hosts=1, x=0, y=1) == "v5"
    assert vm.rename(gpus="g").item(hosts=0, g=2) == "v2"
    assert vm.flatten("r").slice(r=6).item() == "v6"


def test_a_mesh_over_non_zero_global_ranks_slices_by_those_ranks() -> None:
    shape = grid(["a", "b"], [3, 4]).select("b", slice(1, None, 2)).at("a", 2)  # ranks 9, 11
    vm = ValueMesh(shape, ["x", "y"])
    assert vm.slice(b=1).item() == "y"
    assert vm.item(b=0) == "x"


def test_item_returns_the_value_at_the_coordinates(vm: ValueMesh[str]) -> None:
    assert vm.item(hosts=1, gpus=2) == "v6"
    assert vm.slice(hosts=0, gpus=3).item() == "v3"
    assert ValueMesh(Shape.unity(), ["only"]).item() == "only"


def test_item_lets_size_one_dims_be_left_out(vm: ValueMesh[str]) -> None:
    assert vm.slice(hosts=slice(1, 2)).item(gpus=0) == "v4"


def test_item_with_an_unknown_coordinate_raises_key_error(vm: ValueMesh[str]) -> None:
    with pytest.raises(KeyError, match=r"extra coordinate.*'gpu'.*Probably you meant 'gpus'"):
        vm.item(hosts=0, gpus=0, gpu=0)


def test_item_with_missing_coordinates_raises_key_error_saying_which(
    vm: ValueMesh[str],
) -> None:
    # Monarch raises KeyError; danaus's error is also the ValueError it raised before
    with pytest.raises(KeyError, match=r"needs a coordinate for \['gpus'\].*item\(gpus=0\)"):
        vm.item(hosts=0)
    with pytest.raises(ValueError, match=r"\['hosts', 'gpus'\]"):
        vm.item()
    one_dim = ValueMesh(grid(["gpus"], [4]), [0, 1, 2, 3])
    with pytest.raises(KeyError, match=r"\['gpus'\]"):
        one_dim.item()


def test_item_checks_the_range_and_type_of_coordinates(vm: ValueMesh[str]) -> None:
    with pytest.raises(IndexError, match="gpus=4 out of range: size is 4"):
        vm.item(hosts=0, gpus=4)
    with pytest.raises(TypeError, match="slice"):
        vm.item(hosts=0, gpus=slice(0, 2))  # type: ignore[arg-type]


def test_items_yield_local_points_in_rank_order(vm: ValueMesh[str]) -> None:
    cut = vm.slice(hosts=1, gpus=slice(2, None))
    items = list(cut.items())
    extent = Extent(["gpus"], [2])
    assert items == [(Point(0, extent), "v6"), (Point(1, extent), "v7")]
    assert list(cut) == items
    assert [str(p) for p, _ in vm][:2] == [
        "{'hosts': 0/2, 'gpus': 0/4}",
        "{'hosts': 0/2, 'gpus': 1/4}",
    ]


def test_from_indexed_places_values_by_local_index_last_write_wins() -> None:
    shape = grid(["gpus"], [3])
    vm = ValueMesh.from_indexed(shape, [(2, "c"), (0, "a"), (1, "x"), (1, "b")])
    assert vm.values() == ["a", "b", "c"]


def test_from_indexed_with_a_missing_or_bad_index_raises() -> None:
    shape = grid(["gpus"], [3])
    with pytest.raises(ValueError, match=r"no value for local indices \[1\]"):
        ValueMesh.from_indexed(shape, [(0, "a"), (2, "c")])
    with pytest.raises(ValueError, match="index 3 out of range"):
        ValueMesh.from_indexed(shape, [(3, "a")])
    with pytest.raises(TypeError, match="'0'"):
        ValueMesh.from_indexed(shape, [("0", "a")])  # type: ignore[list-item]


def test_equality_compares_extent_and_values_not_global_ranks() -> None:
    a = ValueMesh(grid(["a", "b"], [2, 2]).at("a", 1), [1, 2])  # ranks 2, 3
    b = ValueMesh(grid(["b"], [2]), [1, 2])  # ranks 0, 1
    assert a == b
    assert a != ValueMesh(grid(["b"], [2]), [1, 3])
    assert a != ValueMesh(grid(["c"], [2]), [1, 2])
    assert a != [1, 2]


def test_value_mesh_is_unhashable_because_values_may_be(vm: ValueMesh[str]) -> None:
    with pytest.raises(TypeError, match="unhashable"):
        hash(vm)


def test_value_mesh_pickles_to_an_equal_mesh_that_still_slices(vm: ValueMesh[str]) -> None:
    cut = vm.slice(gpus=slice(1, None, 2))
    back = pickle.loads(pickle.dumps(cut))
    assert back == cut
    assert back.region == cut.region
    assert back.slice(hosts=1).values() == ["v5", "v7"]


def test_repr_prints_the_extent_then_the_point_value_pairs_as_monarch_does() -> None:
    assert repr(ValueMesh(grid(["gpus"], [4]), [0, 1, 2, 3])) == (
        "ValueMesh({gpus: 4}):\n"
        "  (({'gpus': 0/4}, 0), ({'gpus': 1/4}, 1), ({'gpus': 2/4}, 2), ({'gpus': 3/4}, 3))"
    )
    two = repr(ValueMesh(grid(["hosts", "gpus"], [2, 2]), ["a" * 30, "b", "c", "d"]))
    assert two.splitlines() == [
        "ValueMesh({hosts: 2, gpus: 2}):",
        "  (({'hosts': 0/2, 'gpus': 0/2}, '" + "a" * 30 + "'),",
        "   ({'hosts': 0/2, 'gpus': 1/2}, 'b'),",
        "   ({'hosts': 1/2, 'gpus': 0/2}, 'c'),",
        "   ({'hosts': 1/2, 'gpus': 1/2}, 'd'))",
    ]
    # a label that is not an identifier is quoted, as Monarch's Extent shows it
    assert repr(ValueMesh(grid(["dim/0"], [1]), [7])).startswith('ValueMesh({"dim/0": 1}):')


def test_value_mesh_is_subscriptable_as_a_generic() -> None:
    assert ValueMesh[int] is not None
