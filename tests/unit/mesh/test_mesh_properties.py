"""Property tests of the mesh layer: slicing, splitting and decoding agree with brute force."""

from __future__ import annotations

import itertools
import math
import pickle

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from danaus._mesh import Extent, MeshTrait, Point, Shape, Slice, ValueMesh

PROPERTY = settings(max_examples=200, deadline=None, database=None)
NAMES = ["a", "b", "c", "d"]


class RankMesh(MeshTrait):
    """A mesh that is only its Shape (a fake for MeshTrait, not a mock)."""

    def __init__(self, shape: Shape) -> None:
        self.shape = shape

    @property
    def _shape(self) -> Shape:
        return self.shape

    def _new_with_shape(self, shape: Shape) -> RankMesh:
        return RankMesh(shape)


@st.composite
def dense_shapes(draw: st.DrawFn, min_size: int = 0) -> Shape:
    """A row-major shape of up to 4 dims at some offset."""
    ndim = draw(st.integers(0, 4))
    sizes = draw(st.lists(st.integers(min_size, 4), min_size=ndim, max_size=ndim))
    offset = draw(st.integers(0, 6))
    base = Slice.new_row_major(sizes)
    return Shape(NAMES[:ndim], Slice(offset, base.sizes, base.strides))


@st.composite
def slices(draw: st.DrawFn, size: int, nonempty: bool = False) -> slice:
    """A slice with bounds around ``0..size`` (negative ones too) and a positive or no step;
    with ``nonempty``, one that keeps at least one index of a non-empty dim (``mesh.slice``
    refuses the others, as Monarch does; ``Shape.select`` takes any)."""
    bound = st.none() | st.integers(-size - 2, size + 2)
    sel = slice(draw(bound), draw(bound), draw(st.none() | st.integers(1, 3)))
    assume(not nonempty or size == 0 or len(range(size)[sel]) > 0)
    return sel


def selectors(size: int, nonempty: bool = False) -> st.SearchStrategy[int | slice]:
    """An int in range (when there is one) or a slice."""
    if size == 0:
        return slices(size)
    return st.integers(0, size - 1) | slices(size, nonempty)


@st.composite
def cut_shapes(draw: st.DrawFn) -> Shape:
    """A dense shape cut down by a few random selections: a general derived layout."""
    shape = draw(dense_shapes())
    for _ in range(draw(st.integers(0, 3))):
        if not shape.labels:
            break
        label = draw(st.sampled_from(shape.labels))
        sel = draw(selectors(shape.extent[label]))
        shape = shape.at(label, sel) if isinstance(sel, int) else shape.select(label, sel)
    return shape


@st.composite
def shape_and_selection(draw: st.DrawFn) -> tuple[Shape, dict[str, int | slice]]:
    shape = draw(cut_shapes())
    chosen = draw(st.lists(st.sampled_from(shape.labels), unique=True)) if shape.labels else []
    return shape, {label: draw(selectors(shape.extent[label], True)) for label in chosen}


@PROPERTY
@given(shape_and_selection())
def test_slicing_then_enumerating_equals_filtering_ranks_by_coordinates(
    case: tuple[Shape, dict[str, int | slice]],
) -> None:
    shape, selection = case
    got = RankMesh(shape).slice(**selection).shape.ranks()

    def keep(rank: int) -> bool:
        coords = shape.coordinates(rank)
        n = shape.extent
        return all(
            coords[label] == sel if isinstance(sel, int) else coords[label] in range(n[label])[sel]
            for label, sel in selection.items()
        )

    assert got == [r for r in shape.ranks() if keep(r)]


@PROPERTY
@given(cut_shapes(), st.data())
def test_a_slice_keeping_no_index_of_a_non_empty_dim_is_refused(
    shape: Shape, data: st.DataObject
) -> None:
    labels = [label for label in shape.labels if shape.extent[label]]
    assume(labels)
    label = data.draw(st.sampled_from(labels))
    n = shape.extent[label]
    # drawn empty by construction (filtering random slices would discard most draws):
    # past the end, start == stop, or stop before start; any step
    step = st.none() | st.integers(1, 3)
    sel = data.draw(
        st.builds(slice, st.integers(n, n + 3), st.none() | st.integers(-n, n + 3), step)
        | st.integers(-n, n).flatmap(lambda a: st.builds(slice, st.just(a), st.just(a), step))
        | st.integers(0, n - 1).flatmap(
            lambda a: st.builds(slice, st.just(a), st.integers(0, a), step)
        )
    )
    assert not range(n)[sel], sel  # the strategy's promise
    with pytest.raises(ValueError, match="selects no rank"):
        RankMesh(shape).slice(**{label: sel})


@PROPERTY
@given(cut_shapes(), st.data())
def test_slices_of_slices_equal_the_composed_slice(shape: Shape, data: st.DataObject) -> None:
    assume(shape.labels)
    label = data.draw(st.sampled_from(shape.labels))
    n = shape.extent[label]
    first = data.draw(slices(n, True))
    second = data.draw(slices(len(range(n)[first]), True))
    composed = range(n)[first][second]
    mesh = RankMesh(shape)
    twice = mesh.slice(**{label: first}).slice(**{label: second}).shape
    once = mesh.slice(**{label: slice(composed.start, composed.stop, composed.step)}).shape
    assert twice.ranks() == once.ranks()
    assert twice.extent == once.extent
    values = ValueMesh(shape, [f"r{r}" for r in shape.ranks()])
    assert values.slice(**{label: first}).slice(**{label: second}).values() == [
        f"r{r}" for r in once.ranks()
    ]


@PROPERTY
@given(dense_shapes(), st.data())
def test_split_keeps_ranks_and_split_then_flatten_restores_the_rank_order(
    shape: Shape, data: st.DataObject
) -> None:
    assume(shape.labels)
    label = data.draw(st.sampled_from(shape.labels))
    size = shape.extent[label]
    divisors = [d for d in range(1, max(size, 1) + 1) if size % d == 0]
    outer = data.draw(st.sampled_from(divisors))
    mesh = RankMesh(shape)
    split = mesh.split(**{label: ("p", "q")}, p=outer)
    assert split.shape.extent["p"] == outer
    assert split.shape.ranks() == shape.ranks()
    assert split.flatten("r").shape.ranks() == shape.ranks()
    assert mesh.flatten("r").shape == split.flatten("r").shape


@PROPERTY
@given(cut_shapes())
def test_split_of_any_layout_keeps_its_ranks_in_order(shape: Shape) -> None:
    assume(shape.labels)
    label = shape.labels[-1]
    split = RankMesh(shape).split(**{label: ("p", "q")}, p=1)
    assert split.shape.ranks() == shape.ranks()


@PROPERTY
@given(cut_shapes())
def test_coordinates_and_nditem_are_inverse_on_derived_layouts(shape: Shape) -> None:
    s = shape.ndslice
    all_coords = list(itertools.product(*(range(n) for n in s.sizes)))
    assert [s.nditem(list(c)) for c in all_coords] == list(s)
    for pos, rank in enumerate(s):
        assert s.coordinates(rank) == list(all_coords[pos])
        assert s.index(rank) == pos
        assert s[pos] == rank


@PROPERTY
@given(
    st.integers(0, 5),
    st.lists(st.tuples(st.integers(0, 3), st.integers(0, 7)), max_size=3),
    st.integers(0, 30),
)
def test_any_layout_either_names_distinct_ranks_and_decodes_them_or_is_refused(
    offset: int, dims: list[tuple[int, int]], probe: int
) -> None:
    sizes = [n for n, _ in dims]
    strides = [s for _, s in dims]
    ranks = [
        offset + sum(c * s for c, s in zip(coords, strides, strict=True))
        for coords in itertools.product(*(range(n) for n in sizes))
    ]
    if len(set(ranks)) != len(ranks):
        try:
            Slice(offset, sizes, strides)
        except ValueError as e:
            assert "twice" in str(e)
        else:
            raise AssertionError("a slice naming a rank twice was accepted")
        return
    s = Slice(offset, sizes, strides)
    assert list(s) == ranks
    for pos, rank in enumerate(ranks):
        assert s.index(rank) == pos
        assert s.nditem(s.coordinates(rank)) == rank
    assert (probe in s) == (probe in ranks)


def _fewest_runs(ranks: list[int]) -> int:
    """Brute force: the fewest increasing arithmetic runs that split ``ranks`` in order."""

    def is_run(part: list[int]) -> bool:
        steps = {b - a for a, b in itertools.pairwise(part)}
        return len(steps) <= 1 and all(step > 0 for step in steps)

    n = len(ranks)
    best = n
    for cuts in itertools.product([False, True], repeat=max(n - 1, 0)):
        bounds = [0, *[i + 1 for i, cut in enumerate(cuts) if cut], n]
        parts = [ranks[a:b] for a, b in itertools.pairwise(bounds)]
        if all(is_run(p) for p in parts):
            best = min(best, len(parts))
    return best


@PROPERTY
@given(st.lists(st.integers(0, 12), max_size=9))
def test_from_list_covers_exactly_the_input_in_order_with_the_fewest_slices(
    ranks: list[int],
) -> None:
    slices = Slice.from_list(ranks)
    assert [r for s in slices for r in s] == ranks
    assert all(s.ndim == 1 and s.strides[0] > 0 for s in slices)
    assert len(slices) == _fewest_runs(ranks)


@PROPERTY
@given(cut_shapes(), st.data())
def test_every_mesh_value_pickles_to_an_equal_value(shape: Shape, data: st.DataObject) -> None:
    extent = shape.extent
    values = ValueMesh(shape, [("v", r) for r in shape.ranks()])
    objects: list[object] = [shape.ndslice, extent, shape, values]
    if extent.nelements:
        objects.append(Point(data.draw(st.integers(0, extent.nelements - 1)), extent))
    for obj in objects:
        back = pickle.loads(pickle.dumps(obj))
        assert back == obj
        assert repr(back) == repr(obj)


@PROPERTY
@given(shape_and_selection())
def test_value_mesh_slices_carry_the_values_of_their_global_ranks(
    case: tuple[Shape, dict[str, int | slice]],
) -> None:
    shape, selection = case
    vm = ValueMesh(shape, shape.ranks()).slice(**selection)
    assert vm.values() == list(vm.region.slice())
    for point, value in vm.items():
        assert point.extent == vm.extent
        assert vm.item(**point) == value


@PROPERTY
@given(st.lists(st.integers(0, 4), max_size=4), st.data())
def test_point_coordinates_match_the_row_major_slice(sizes: list[int], data: st.DataObject) -> None:
    extent = Extent(NAMES[: len(sizes)], sizes)
    assume(extent.nelements > 0)
    rank = data.draw(st.integers(0, extent.nelements - 1))
    assert list(Point(rank, extent).values()) == Slice.new_row_major(sizes).coordinates(rank)
    assert math.prod(sizes) == extent.nelements
