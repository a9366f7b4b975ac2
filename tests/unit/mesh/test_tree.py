"""The cast tree's arithmetic (pure): every rank once, paths, selections."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from danaus._mesh import Slice
from danaus._mesh.tree import (
    Selection,
    depth,
    node_children,
    node_range,
    path,
    root_children,
)


@given(st.integers(1, 600), st.integers(2, 20))
@settings(max_examples=150, deadline=None)
def test_every_rank_is_one_node_and_its_path_is_the_walk_from_the_sender(n: int, f: int) -> None:
    seen: list[int] = []
    deepest = 0

    def walk(lo: int, hi: int, trail: list[tuple[int, int]]) -> None:
        nonlocal deepest
        seen.append(lo)
        assert path(lo, n, f) == [*trail, (lo, hi)]
        assert node_range(lo, n, f) == (lo, hi)
        deepest = max(deepest, len(trail) + 1)
        kids = node_children(lo, hi, f)
        assert len(kids) <= f
        for a, b in kids:
            walk(a, b, [*trail, (lo, hi)])

    kids = root_children(n, f)
    assert len(kids) <= f
    for a, b in kids:
        walk(a, b, [])
    assert sorted(seen) == list(range(n))
    assert deepest == depth(n, f)


def test_depth_grows_with_log_of_the_mesh() -> None:
    assert [depth(n, 16) for n in (16, 64, 512, 4096, 8192)] == [1, 2, 3, 3, 4]


@st.composite
def increasing_slices(draw: st.DrawFn) -> Slice:
    sizes = draw(st.lists(st.integers(0, 4), max_size=3))
    strides: list[int] = []
    span = 0
    for z in reversed(sizes):
        stride = span + 1 + draw(st.integers(0, 3))
        strides.insert(0, stride)
        span += max(z - 1, 0) * stride
    return Slice(draw(st.integers(0, 9)), sizes, strides)


@given(increasing_slices())
@settings(max_examples=300, deadline=None)
def test_a_strided_selection_counts_like_its_list_of_ranks(s: Slice) -> None:
    sel = Selection.from_wire(Selection.of(s).to_wire())
    ranks = list(s)
    assert sel.to_wire()[0] == "s"
    assert len(sel) == len(ranks)
    top = max(ranks, default=0) + 3
    for x in range(-1, top):
        assert sel.count_below(x) == sum(r < x for r in ranks)
        assert (x in sel) == (x in ranks)
    for i, r in enumerate(ranks):
        assert sel.slot(r) == i
    assert list(sel.ranks_in(0, top)) == list(enumerate(ranks))


def test_a_selection_that_is_not_increasing_keeps_each_ranks_slot() -> None:
    transposed = Slice(0, [3, 2], [1, 3])  # ranks 0, 3, 1, 4, 2, 5
    sel = Selection.of(transposed)
    assert sel.to_wire()[0] == "l"
    assert [sel.slot(r) for r in range(6)] == [0, 2, 4, 1, 3, 5]
    assert list(sel.ranks_in(1, 4)) == [(2, 1), (4, 2), (1, 3)]
    assert sel.count_in(2, 6) == 4
