"""Selection: Monarch's routing expressions, their grammar, repr and evaluation.

The parse tests are ndslice's ``selection/parse.rs`` tests; the evaluation tests
are ``selection.rs``'s (slice 2 zones x 4 hosts x 8 GPUs), with Rust's
``range(0..4, ..)`` written ``S.range(range(0, 4), ..)`` and ``range(4.., ..)``
written ``S.range(slice(4, None), ..)``. ``TestSelection`` is Monarch's own
``python/tests/_monarch/test_ndslice.py`` class, verbatim.
"""

from __future__ import annotations

import copy
import pickle
from unittest import TestCase

import pytest

import danaus
from danaus._mesh import Region, Shape, Slice
from danaus.common.selection import Selection

S = Selection
T = S.true_()
F = S.false_()
all_ = S.all
any_ = S.any
first = S.first
rng = S.range
union = S.union
inter = S.intersection


def r(start: int, end: int | None = None, step: int = 1) -> slice:
    """Rust's ``shape::Range(start, end, step)``."""
    return slice(start, end, step)


@pytest.fixture
def sl() -> Slice:
    """ndslice's test slice: 2 zones x 4 hosts x 8 GPUs, row-major."""
    return Slice(0, [2, 4, 8], [32, 8, 1])


def ev(sel: Selection, where: Slice | Shape, **kw: object) -> list[int]:
    """Rust's lenient ``eval``: no expansion to the slice's depth."""
    return sel.eval(where, expand=False, **kw)  # type: ignore[arg-type]


def steps(*ranges: range) -> list[int]:
    return [i for rg in ranges for i in rg]


# -- Monarch's TestSelection, verbatim --------------------------------------------------


class TestSelection(TestCase):
    def test_constants(self) -> None:
        self.assertEqual(repr(Selection.any()), "Any(True)")
        self.assertEqual(repr(Selection.all()), "All(True)")

    def test_parse(self) -> None:
        sel = Selection.from_string("(*, 1:3) & (0, *)")
        self.assertIsInstance(sel, Selection)
        self.assertEqual(
            repr(sel),
            "Intersection(All(Range(Range(1, Some(3), 1), True)), Range(Range(0, Some(1), 1), All(True)))",  # noqa: E501
        )

    def test_parse_invalid(self) -> None:
        with self.assertRaises(ValueError):
            Selection.from_string("this is not valid selection syntax")


# -- parse.rs: test_selection_11, test_12 ------------------------------------------------

PARSES = [
    ("*", all_(T)),
    ("*,*", all_(all_(T))),
    ("*,*,*", all_(all_(all_(T)))),
    ("4:8", rng(r(4, 8), T)),
    ("4:", rng(r(4), T)),
    ("4", rng(r(4, 5), T)),
    (":", rng(r(0), T)),
    ("0,0,0", rng(0, rng(0, rng(0, T)))),
    ("1,1,1", rng(1, rng(1, rng(1, T)))),
    ("*,0", all_(rng(0, T))),
    ("*,0,*", all_(rng(0, all_(T)))),
    ("*,*,4:", all_(all_(rng(slice(4, None), T)))),
    ("*,*,1::2", all_(all_(rng(r(1, None, 2), T)))),
    ("*,*,:4|*,*,4:", union(all_(all_(rng(range(0, 4), T))), all_(all_(rng(r(4), T))))),
    (
        "*,0,:4|*,1,4:8",
        union(all_(rng(0, rng(range(0, 4), T))), all_(rng(1, rng(range(4, 8), T)))),
    ),
    ("*,*,(:2|6:)", all_(all_(union(rng(range(0, 2), T), rng(r(6), T))))),
    ("*,*,(1:4:2|5::2)", all_(all_(union(rng(r(1, 4, 2), T), rng(r(5, None, 2), T))))),
    ("*&*", inter(all_(T), all_(T))),
    ("*&*,*,4:8", inter(all_(T), all_(all_(rng(range(4, 8), T))))),
    ("*,*,0:5&*,*,4:8", inter(all_(all_(rng(range(0, 5), T))), all_(all_(rng(range(4, 8), T))))),
    ("?,?,?", any_(any_(any_(T)))),
    ("0,?,:4", rng(0, any_(rng(range(0, 4), T)))),
    ("0,?", rng(0, any_(T))),
    ("?", any_(T)),
    ("0,0,?|0,0,?", union(rng(0, rng(0, any_(T))), rng(0, rng(0, any_(T))))),
    ("*,*,1:4|5:6", union(all_(all_(rng(range(1, 4), T))), rng(range(5, 6), T))),
    ("*,*,(1:4|5:6)", all_(all_(union(rng(range(1, 4), T), rng(range(5, 6), T))))),
    ("*,(1:4|5:6),*", all_(union(rng(r(1, 4), all_(T)), rng(r(5, 6), all_(T))))),
    ("(*,*,*)&(*,*,*)", inter(all_(all_(all_(T))), all_(all_(all_(T))))),
    (
        "(0,*,*)&(0,(1|3),*)",
        inter(rng(0, all_(all_(T))), rng(0, union(rng(1, all_(T)), rng(3, all_(T))))),
    ),
    (
        "(*,*,(:2|6:))&(*,*,4:)",
        inter(
            all_(all_(union(rng(range(0, 2), T), rng(r(6), T)))),
            all_(all_(rng(r(4), T))),
        ),
    ),
    ("((1:4),2)", rng(range(1, 4), rng(2, T))),
    ("*,*,*,*,*,*", all_(all_(all_(all_(all_(all_(T))))))),
]


@pytest.mark.parametrize(("text", "expected"), PARSES, ids=[p[0] for p in PARSES])
def test_parses_to(text: str, expected: Selection) -> None:
    assert S.from_string(text) == expected
    assert repr(S.from_string(text)) == repr(expected)


def test_whitespace_is_ignored_anywhere() -> None:
    assert S.from_string(" ( * ,\t1 : 3 )\n& ( 0 , * ) ") == S.from_string("(*,1:3)&(0,*)")
    assert S.from_string("1 2") == rng(12, T)  # as Rust's parser, which strips it first


def test_repr_is_rusts_debug_form() -> None:
    assert repr(S.from_string("4:")) == "Range(Range(4, None, 1), True)"
    assert repr(S.from_string("1::2")) == "Range(Range(1, None, 2), True)"
    assert repr(first(F)) == "First(False)"
    assert repr(S.label(["A100", 'q"\n'], any_())) == (
        'Label([Value("A100"), Value("q\\"\\n")], Any(True))'
    )
    assert repr(S.from_string("*|?")) == "Union(All(True), Any(True))"
    assert str(S.all()) == repr(S.all())  # Monarch's class has only __repr__


@pytest.mark.parametrize(
    ("text", "position", "expected"),
    [
        ("this is not valid", 0, "expected '(', '*', '?', a number or ':', found 't'"),
        ("", 0, "found the end of the input"),
        ("1:3:", 4, "expected the step of the range (a number)"),
        ("(1", 2, "expected ')', '|', '&' or ','"),
        ("*,", 2, "expected '(', '*', '?', a number or ':'"),
        ("*)", 1, "expected '|', '&', ',' or the end of the expression, found ')'"),
        ("1::0", 3, "a step of at least 1"),
        ("  *, x", 5, "found 'x'"),  # the position counts the whitespace
        ("*&|*", 2, "found '|'"),
        ("-1", 0, "found '-'"),
    ],
)
def test_invalid_syntax_is_a_value_error_with_position_and_what_was_expected(
    text: str, position: int, expected: str
) -> None:
    with pytest.raises(ValueError) as info:
        S.from_string(text)
    assert f"at position {position} " in str(info.value)
    assert expected in str(info.value)
    assert repr(text) in str(info.value)


def test_from_string_refuses_a_non_string() -> None:
    with pytest.raises(TypeError, match="needs a str"):
        S.from_string(3)  # type: ignore[arg-type]


# -- value semantics ---------------------------------------------------------------------


def test_equality_and_hash_are_structural() -> None:
    a = S.from_string("*,0:4|?")
    b = union(all_(rng(range(0, 4))), any_())
    assert a == b and hash(a) == hash(b)
    assert a != S.from_string("*,0:5|?")
    assert len({a, b, S.all()}) == 2
    assert S.from_string("*") & S.from_string("0") == inter(all_(T), rng(0, T))
    assert (S.all() | S.any()) == union(all_(), any_())
    assert S.all() != "All(True)"


def test_selections_pickle_copy_and_are_immutable() -> None:
    sel = union(S.label(["a"], first(rng(r(1, None, 2), F))), S.from_string("(*,1:3)&(0,*)"))
    for proto in range(pickle.HIGHEST_PROTOCOL + 1):
        back = pickle.loads(pickle.dumps(sel, proto))
        assert back == sel and repr(back) == repr(sel)
    assert copy.deepcopy(sel) == sel
    with pytest.raises(AttributeError, match="immutable"):
        sel._kind = "True"  # type: ignore[misc]
    with pytest.raises(TypeError, match="no public constructor"):
        Selection()


def test_selection_is_exported_where_monarch_has_it() -> None:
    assert danaus.Selection is Selection
    assert Selection.__module__ == "danaus"
    assert "Selection" in danaus.__all__


@pytest.mark.parametrize(
    ("bad", "error", "match"),
    [
        (-1, ValueError, ">= 0"),
        (range(3, 1, -1), ValueError, ">= 0"),
        (slice(0, 4, 0), ValueError, ">= 1"),
        (True, TypeError, "index, a range or a slice"),
        ("0:4", TypeError, "index, a range or a slice"),
        (slice("a", 2), TypeError, "must be an int"),
    ],
)
def test_range_refuses_bad_bounds(bad: object, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        rng(bad)  # type: ignore[arg-type]


def test_constructors_refuse_what_is_not_a_selection() -> None:
    with pytest.raises(TypeError, match="expected a Selection"):
        all_("*")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="expected a Selection"):
        union(S.all(), None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="sequence of str labels"):
        S.label("A100")
    with pytest.raises(TypeError, match="each label must be a str"):
        S.label([1])  # type: ignore[list-item]


# -- selection.rs: evaluation --------------------------------------------------------------


def test_selection_00_true_and_false(sl: Slice) -> None:
    assert ev(F, sl) == []
    assert ev(all_(F), sl) == []
    assert ev(all_(all_(F)), sl) == []
    assert ev(T, sl) == list(range(64))
    assert ev(T, sl) == ev(all_(T), sl) == ev(all_(all_(T)), sl) == ev(all_(all_(all_(T))), sl)
    assert ev(all_(all_(all_(F))), sl) == []


def test_selection_01_06_deeper_than_the_slice_is_a_value_error(sl: Slice) -> None:
    with pytest.raises(ValueError) as info:
        ev(all_(all_(all_(all_(T)))), sl)
    assert str(info.value) == "selection `all(all(all(all(true_()))))` exceeds dimensionality 3"
    with pytest.raises(ValueError) as info:
        ev(first(first(first(first(T)))), sl)
    assert str(info.value) == (
        "selection `first(first(first(first(true_()))))` exceeds dimensionality 3"
    )
    with pytest.raises(ValueError, match=r"`range\(0:1:1, range\(2::1, all\(true_\(\)\)\)\)`"):
        S.from_string("0,2:,*").eval(Slice.new_row_major([2, 3]))


def test_selection_02_ranges(sl: Slice) -> None:
    assert ev(rng(0, rng(0, rng(0, T))), sl) == [0]
    assert ev(rng(1, rng(1, rng(1, T))), sl) == [41]
    assert ev(all_(rng(0, all_(T))), sl) == steps(range(0, 8), range(32, 40))
    assert ev(all_(rng(1, all_(T))), sl) == steps(range(8, 16), range(40, 48))
    assert ev(all_(all_(rng(range(0, 4), T))), sl) == steps(
        *(range(b, b + 4) for b in range(0, 64, 8))
    )
    assert ev(all_(all_(rng(range(4, 8), T))), sl) == steps(
        *(range(b + 4, b + 8) for b in range(0, 64, 8))
    )
    odd = steps(*(range(b + 1, b + 8, 2) for b in range(0, 64, 8)))
    assert ev(all_(all_(rng(r(1, None, 2), T))), sl) == odd


def test_selection_03_intersection(sl: Slice) -> None:
    assert ev(inter(T, T), sl) == ev(T, sl)
    assert ev(inter(T, F), sl) == ev(inter(F, T), sl) == ev(inter(F, F), sl) == []
    lo = all_(all_(rng(range(0, 4), T)))
    hi = all_(all_(rng(range(4, 8), T)))
    assert ev(inter(lo, hi), sl) == []
    assert ev(inter(T, hi), sl) == ev(hi, sl)
    assert ev(inter(all_(all_(rng(range(0, 5), T))), hi), sl) == ev(all_(all_(rng(4, T))), sl)


def test_selection_04_union(sl: Slice) -> None:
    assert ev(union(T, T), sl) == ev(union(F, T), sl) == ev(union(T, F), sl) == ev(T, sl)
    assert ev(union(F, F), sl) == []
    lo = all_(all_(rng(range(0, 4), T)))
    assert ev(union(lo, all_(all_(rng(slice(4, None), T)))), sl) == ev(T, sl)
    s = all_(rng(0, rng(range(0, 4), T)))
    t = all_(rng(1, rng(slice(4, None), T)))
    assert ev(union(s, t), sl) == steps(range(0, 4), range(12, 16), range(32, 36), range(44, 48))
    skip = all_(all_(union(rng(range(0, 2), T), rng(range(6, 8), T))))
    assert ev(skip, sl) == steps(
        *(rg for b in range(0, 64, 8) for rg in (range(b, b + 2), range(b + 6, b + 8)))
    )
    odd = all_(all_(union(rng(r(1, 4, 2), T), rng(r(5, 8, 2), T))))
    assert ev(odd, sl) == steps(*(range(b + 1, b + 8, 2) for b in range(0, 64, 8)))
    singles = all_(all_(union(union(rng(1, T), rng(3, T)), union(rng(5, T), rng(7, T)))))
    assert ev(odd, sl) == ev(singles, sl)


def test_selection_05_first(sl: Slice) -> None:
    assert ev(first(first(F)), sl) == []
    assert ev(first(first(rng(range(0, 1), T))), sl) == [0]
    assert ev(first(first(T)), sl) == list(range(8))
    assert ev(first(first(first(F))), sl) == []
    assert ev(first(first(first(T))), sl) == [0]
    assert ev(all_(first(T)), sl) == steps(range(0, 8), range(32, 40))
    assert ev(first(first(rng(range(0, 3), T))), sl) == [0, 1, 2]
    # The first index under which the inner selection selects anything: host 2 here.
    assert ev(rng(0, first(rng(range(5, 6), T))), Slice.new_row_major([1, 4, 4])) == []
    assert ev(first(rng(range(2, 3), T)), Slice.new_row_major([3, 4])) == [2]
    assert ev(first(rng(3)), Slice.new_row_major([2, 4])) == [3]


def test_selection_07_agrees_with_shape_select() -> None:
    s = Shape(["host", "gpu"], Slice.new_row_major([2, 8]))
    assert ev(rng(range(1, 2), T), s) == s.select("host", slice(1, 2)).ranks()
    assert ev(all_(rng(slice(2, None), T)), s) == s.select("gpu", slice(2, None)).ranks()
    assert ev(all_(rng(range(3, 5), T)), s) == s.select("gpu", slice(3, 5)).ranks()
    both = s.select("gpu", slice(3, 5)).select("host", slice(1, 2))
    assert ev(rng(range(1, 2), rng(range(3, 5), T)), s) == both.ranks()
    # Empty and out-of-range ranges select nothing (lenient evaluation).
    assert ev(all_(rng(range(1, 1), T)), s) == []
    assert ev(all_(rng(range(8, 8), T)), s) == []
    assert ev(all_(rng(8, T)), s) == []
    assert ev(all_(rng(range(6, 20), T)), s) == [6, 7, 14, 15]


def test_selection_09_any(sl: Slice) -> None:
    assert ev(any_(F), sl) == ev(F, sl) == []
    res = ev(any_(any_(any_(T))), sl)
    assert len(res) == 1 and res[0] < 64
    res = ev(rng(0, any_(rng(range(0, 4), T))), sl)
    assert any(res == ev(rng(0, rng(h, rng(range(0, 4), T))), sl) for h in range(4))
    res = ev(rng(0, rng(0, any_(T))), sl)
    assert len(res) == 1 and res[0] < 8
    # Without expansion a trailing Any(True) picks one host and keeps all its GPUs.
    res = ev(rng(0, any_(T)), sl)
    assert any(res == ev(rng(0, rng(h, T)), sl) for h in range(4))
    res = ev(rng(1, any_(T)), sl)
    assert any(res == ev(rng(1, rng(h, T)), sl) for h in range(4))
    two = union(rng(0, rng(0, any_(T))), rng(0, rng(0, any_(T))))
    seeds = (seed for seed in range(1000) if len(ev(two, sl, seed=seed)) == 2)
    i, j = ev(two, sl, seed=next(seeds))
    assert i < j < 8


def test_eval_zero_dim_slice() -> None:
    s0 = Slice(1, [], [])
    assert ev(T, s0) == [1]
    assert ev(F, s0) == []
    assert ev(all_(T), s0) == [1]
    assert ev(all_(F), s0) == []
    assert ev(union(T, T), s0) == [1]
    assert ev(inter(T, F), s0) == []
    assert S.any().eval(s0) == [1]
    assert S.all().eval(Shape.unity()) == [0]


# -- of_ranks (selection.rs's test_of_ranks_*) --------------------------------------------


def test_of_ranks_selects_exactly_those_ranks() -> None:
    s1 = Slice.new_row_major([5])
    assert S.of_ranks(s1, [3, 1]).eval(s1) == [1, 3]
    assert S.of_ranks(Slice.new_row_major([4]), []) == F
    assert S.of_ranks(s1, [2]) == rng(range(2, 3), T)
    s2 = Slice.new_row_major([2, 3])
    assert S.of_ranks(s2, [2, 3, 4]) == union(
        union(rng(0, rng(2, T)), rng(1, rng(0, T))), rng(1, rng(1, T))
    )
    s3 = Slice.new_row_major([2, 2, 2])
    assert S.of_ranks(s3, [1, 6]) == union(rng(0, rng(0, rng(1, T))), rng(1, rng(1, rng(0, T))))
    with pytest.raises(ValueError, match="rank 4 is not in"):
        S.of_ranks(Slice.new_row_major([4]), [0, 4])
    with pytest.raises(TypeError, match="needs a Slice"):
        S.of_ranks([0, 1], [0])  # type: ignore[arg-type]


# -- danaus: expansion, seeds, strided slices, shapes ---------------------------------------


def test_all_and_any_expand_to_the_slices_dimensionality(sl: Slice) -> None:
    assert S.all().eval(sl) == list(range(64))
    for seed in range(20):
        picked = S.any().eval(sl, seed=seed)
        assert len(picked) == 1 and 0 <= picked[0] < 64
    # 64 ranks, 20 seeds: the pick depends on the seed.
    assert len({S.any().eval(sl, seed=seed)[0] for seed in range(20)}) > 1
    # Expansion reaches a trailing Any(True) under other combinators, as Monarch's routing.
    assert len(S.from_string("0,?").eval(sl, seed=3)) == 1
    assert len(S.from_string("0,?").eval(sl, seed=3, expand=False)) == 8
    assert S.from_string("1").eval(sl) == list(range(32, 64))


def test_any_is_deterministic_given_a_seed(sl: Slice) -> None:
    sel = S.from_string("?,?,? | 1,?,0:4")
    assert all(sel.eval(sl, seed=7) == sel.eval(sl, seed=7) for _ in range(5))
    label_any = S.label(["A100"], any_(all_(T)))
    assert label_any.eval(sl, seed=11) == label_any.eval(sl, seed=11)
    assert len(label_any.eval(sl, seed=11)) == 32


def test_label_filters_nothing_and_consumes_no_dimension(sl: Slice) -> None:
    assert S.label(["A100"], all_(all_(all_(T)))).eval(sl) == list(range(64))
    assert S.label(["A100"], all_(rng(1))).eval(sl) == steps(range(8, 16), range(40, 48))


def test_eval_returns_global_ranks_of_a_strided_slice_in_its_order() -> None:
    # Offset 5, transposed strides: iteration order is not ascending.
    s = Slice(5, [2, 3], [1, 2])
    assert list(s) == [5, 7, 9, 6, 8, 10]
    assert S.all().eval(s) == [5, 7, 9, 6, 8, 10]
    assert S.from_string("*,1:").eval(s) == [7, 9, 8, 10]
    assert S.from_string("(*,1:) | 1,0").eval(s) == [7, 9, 6, 8, 10]
    assert S.from_string("(*,1:) & (1,*)").eval(s) == [8, 10]


def test_eval_takes_a_shape_or_region() -> None:
    shape = Shape(["host", "gpu"], Slice(100, [2, 4], [4, 1]))
    sel = S.from_string("*, 1:3")
    assert sel.eval(shape) == [101, 102, 105, 106]
    assert sel.eval(Region(shape.labels, shape.ndslice)) == [101, 102, 105, 106]
    with pytest.raises(TypeError, match="needs a Slice, Shape or Region"):
        sel.eval([2, 4])  # type: ignore[arg-type]


def test_eval_on_an_empty_dimension_selects_nothing() -> None:
    s = Slice.new_row_major([2, 0])
    assert S.all().eval(s) == []
    assert S.any().eval(s) == []
    assert S.from_string("0,?").eval(s) == []
