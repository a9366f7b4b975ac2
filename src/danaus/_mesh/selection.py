"""Selection: Monarch's algebra of routing expressions over a mesh's dimensions.

A ``Selection`` is an immutable expression tree that says, dimension by
dimension, which coordinates of a ``Slice`` it selects. Its constructors are
Monarch's (``ndslice::selection``): ``False`` and ``True`` (nothing; everything
from here on), and, each consuming one dimension and continuing with an inner
selection, ``All`` (every index), ``First`` (the first index under which the
inner selection selects anything), ``Range`` (``start:end:step``) and ``Any``
(one index at random); ``Label`` (attribute filters; danaus, like Monarch, has
no label source yet, so it filters nothing) and ``Intersection``/``Union``
(combining two selections at the same dimension)::

    >>> Selection.from_string("(*, 1:3) & (0, *)")
    Intersection(All(Range(Range(1, Some(3), 1), True)), Range(Range(0, Some(1), 1), All(True)))
    >>> Selection.from_string("*, 1:3").eval(Slice.new_row_major([2, 4]))
    [1, 2, 5, 6]

The textual grammar is Monarch's (``ndslice/src/selection/parse.rs``); all
whitespace is ignored:

    expression   ::= union
    union        ::= intersection ( "|" intersection )*
    intersection ::= chain ( "&" chain )*
    chain        ::= group ( "," group )*
    group        ::= range | index | "*" | "?" | "(" expression ")"
    range        ::= number? ":" number? ( ":" number )?
    index        ::= number
    number       ::= [0-9]+

``,`` descends into the next dimension and binds tightest, then ``&``, then
``|``: ``*,*,1:4|5:6`` is the union of ``*,*,1:4`` and ``5:6``; write
``*,*,(1:4|5:6)`` to unite in the third dimension only. A range's start
defaults to 0, its end to the size of the dimension, its step to 1; an index
``3`` is the range ``3:4``.

``repr`` is Rust's ``Debug`` form, character for character, as Monarch's
``repr`` shows it. Evaluation (``eval``) follows ``Selection::eval``: the ranks
come back in the slice's iteration order, each once; a range past the end of
its dimension selects what lies inside it (nothing when it starts past it);
a selection deeper than the slice raises ValueError.
"""

from __future__ import annotations

import builtins
import math
import random
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

from ._check import as_int_list, as_nonneg_int
from .shape import Region, Shape
from .slice import Slice

__all__ = ["Selection"]

# The kinds of node, named as Rust's Debug output names them.
_FALSE = "False"
_TRUE = "True"
_ALL = "All"
_FIRST = "First"
_RANGE = "Range"
_LABEL = "Label"
_ANY = "Any"
_INTERSECTION = "Intersection"
_UNION = "Union"

# Kinds that consume one dimension and continue with one inner selection.
_DESCENDING = frozenset((_ALL, _FIRST, _ANY))

_RangeT = tuple[int, "int | None", int]

_DIGITS = frozenset("0123456789")


class Selection:
    """An immutable, hashable, picklable selection expression (Monarch's ``Selection``).

    Build one with ``from_string``, the constants ``all()`` and ``any()``, the
    constructors ``true_``, ``false_``, ``all``, ``first``, ``range``, ``label``,
    ``any``, ``intersection`` and ``union`` (each descending one takes its inner
    selection, ``True`` when omitted), or the operators ``a & b`` and ``a | b``.
    Equality is structural: two selections are equal when their trees are.
    """

    __slots__ = ("_args", "_kind")

    _kind: str
    _args: tuple[Any, ...]

    _TRUE_NODE: ClassVar[Selection]
    _FALSE_NODE: ClassVar[Selection]

    def __init__(self) -> None:
        raise TypeError(
            "Selection has no public constructor; use Selection.from_string('*, 0:4'), "
            "Selection.all(), Selection.any() or Selection.range(...)"
        )

    @classmethod
    def _node(cls, kind: str, *args: Any) -> Selection:
        self = object.__new__(cls)
        object.__setattr__(self, "_kind", kind)
        object.__setattr__(self, "_args", args)
        return self

    # -- constructors -------------------------------------------------------

    @classmethod
    def from_string(cls, s: str) -> Selection:
        """Parse a selection expression such as ``"(*, 0:4)"`` or ``"0 & (1 | 2)"``.

        Raises TypeError if ``s`` is not a str, ValueError naming the position
        and what was expected there if it is not a valid expression.
        """
        if not isinstance(s, str):
            raise TypeError(f"Selection.from_string needs a str, got {s!r}")
        return _Parser(s).parse()

    @classmethod
    def true_(cls) -> Selection:
        """Select everything from the current dimension on."""
        return cls._TRUE_NODE

    @classmethod
    def false_(cls) -> Selection:
        """Select nothing."""
        return cls._FALSE_NODE

    @classmethod
    def all(cls, inner: Selection | None = None) -> Selection:
        """Every index of the current dimension, then ``inner`` (default ``True``).

        ``Selection.all()`` is ``All(True)``, "route to all nodes": it selects every
        rank of a slice of any dimensionality (``*, *, *`` in a 3-d slice).
        """
        return cls._node(_ALL, _inner(inner))

    @classmethod
    def any(cls, inner: Selection | None = None) -> Selection:
        """One index of the current dimension, chosen at random, then ``inner``.

        ``Selection.any()`` is ``Any(True)``, "route to a single random node":
        ``eval`` expands it to the slice's dimensionality (``?, ?, ?`` in a 3-d
        slice), so it selects exactly one rank.
        """
        return cls._node(_ANY, _inner(inner))

    @classmethod
    def first(cls, inner: Selection | None = None) -> Selection:
        """The first index of the current dimension under which ``inner`` selects anything."""
        return cls._node(_FIRST, _inner(inner))

    @classmethod
    def range(cls, r: int | builtins.range | slice, inner: Selection | None = None) -> Selection:
        """The indices ``r`` of the current dimension, then ``inner``.

        ``r`` is an index (``3`` is ``3:4``), a ``range`` or a ``slice`` with
        non-negative bounds and a positive step; a ``slice`` may leave its end
        open (``slice(4, None)`` is ``4:``, to the end of the dimension).
        Raises TypeError or ValueError for anything else.
        """
        return cls._node(_RANGE, _as_range(r), _inner(inner))

    @classmethod
    def label(cls, labels: Iterable[str], inner: Selection | None = None) -> Selection:
        """The indices of the current dimension carrying one of ``labels``, then ``inner``.

        Labels are values attached to indices (a GPU model such as ``"A100"``),
        not dimension names. Neither Monarch nor danaus has a source of such
        labels yet, so evaluation keeps every index, as Monarch's does; a
        ``Label`` does not consume a dimension itself.
        """
        if isinstance(labels, str) or not isinstance(labels, Iterable):
            raise TypeError(f"Selection.label needs a sequence of str labels, got {labels!r}")
        out = tuple(labels)
        for lab in out:
            if not isinstance(lab, str):
                raise TypeError(f"each label must be a str, got {lab!r} in {labels!r}")
        return cls._node(_LABEL, out, _inner(inner))

    @classmethod
    def intersection(cls, a: Selection, b: Selection) -> Selection:
        """What both ``a`` and ``b`` select (``a & b``)."""
        return cls._node(_INTERSECTION, _check(a), _check(b))

    @classmethod
    def union(cls, a: Selection, b: Selection) -> Selection:
        """What ``a`` or ``b`` selects (``a | b``)."""
        return cls._node(_UNION, _check(a), _check(b))

    @classmethod
    def of_ranks(cls, slice: Slice, ranks: Iterable[int]) -> Selection:
        """The selection of exactly ``ranks`` in ``slice``: a union of one chain of
        single-index ranges per rank, in ascending order of rank (``False`` for none).

        Raises ValueError for a rank the slice does not hold.
        """
        if not isinstance(slice, Slice):
            raise TypeError(f"Selection.of_ranks needs a Slice, got {slice!r}")
        out: Selection | None = None
        for rank in sorted(set(as_int_list(ranks, "ranks"))):
            chain = cls._TRUE_NODE
            for c in reversed(slice.coordinates(rank)):
                chain = cls._node(_RANGE, (c, c + 1, 1), chain)
            out = chain if out is None else cls._node(_UNION, out, chain)
        return cls._FALSE_NODE if out is None else out

    def __and__(self, other: object) -> Selection:
        if not isinstance(other, Selection):
            return NotImplemented
        return Selection._node(_INTERSECTION, self, other)

    def __or__(self, other: object) -> Selection:
        if not isinstance(other, Selection):
            return NotImplemented
        return Selection._node(_UNION, self, other)

    # -- evaluation ---------------------------------------------------------

    def eval(
        self,
        where: Slice | Shape | Region,
        *,
        seed: int | None = None,
        expand: bool = True,
    ) -> list[int]:
        """Return the global ranks of ``where`` (a ``Slice``, ``Shape`` or ``Region``)
        this selection selects, in the slice's iteration order, each once.

        With ``expand`` (the default) the selection is first expanded to the
        slice's dimensionality as Monarch's routing does (``canonicalize_to_dimensions``):
        ``True``/``False`` left before the last dimension become ``*, ..., *``
        and an ``Any(True)`` there becomes ``?, ..., ?``, so ``Selection.any()``
        picks one rank. ``expand=False`` evaluates as ``Selection::eval`` does,
        where ``0, ?`` in a 3-d slice picks one index of the second dimension
        and keeps every index of the third.

        ``Any`` picks uniformly at random with ``random.Random(seed)``, one draw
        per ``Any`` reached, in the order of evaluation: a given ``seed`` gives
        the same ranks every time, ``None`` fresh ones. A 0-dimensional slice is
        treated as 1-dimensional of size 1, as Monarch does. Raises ValueError
        when the selection descends more dimensions than the slice has.
        """
        slice = _as_slice(where)
        sizes = tuple(slice.sizes)
        if not sizes:  # the empty product: one rank, treated as one dimension of size 1
            sizes = (1,)
        sel = self._expand(0, len(sizes)) if expand else self
        sel._validate(0, len(sizes), self)
        # blocks[d]: the number of positions under one index of dimension d - 1.
        blocks = [math.prod(sizes[d:]) for d in range(len(sizes) + 1)]
        positions = sel._eval(0, 0, sizes, blocks, random.Random(seed))
        if not slice.sizes:
            return [slice.offset] if positions else []
        return [slice.get(p) for p in positions]

    def _validate(self, dim: int, ndim: int, top: Selection) -> None:
        kind = self._kind
        if dim == ndim:
            if kind in (_TRUE, _FALSE):
                return
            raise ValueError(f"selection `{top._pretty()}` exceeds dimensionality {ndim}")
        if kind in _DESCENDING or kind == _RANGE:
            self._args[-1]._validate(dim + 1, ndim, top)
        elif kind == _LABEL:
            self._args[1]._validate(dim, ndim, top)
        elif kind in (_INTERSECTION, _UNION):
            self._args[0]._validate(dim, ndim, top)
            self._args[1]._validate(dim, ndim, top)

    def _eval(
        self,
        dim: int,
        base: int,
        sizes: Sequence[int],
        blocks: Sequence[int],
        rng: random.Random,
    ) -> list[int]:
        """The positions (in row-major order of coordinates) under the prefix ``base``
        of the first ``dim`` coordinates; ascending, each once."""
        kind = self._kind
        if kind == _FALSE:
            return []
        if kind == _TRUE:
            block = blocks[dim]
            return list(range(base * block, (base + 1) * block))
        if kind == _INTERSECTION:
            a = self._args[0]._eval(dim, base, sizes, blocks, rng)
            b = set(self._args[1]._eval(dim, base, sizes, blocks, rng))
            return [p for p in a if p in b]
        if kind == _UNION:
            a = self._args[0]._eval(dim, base, sizes, blocks, rng)
            b = self._args[1]._eval(dim, base, sizes, blocks, rng)
            return sorted(set(a).union(b))
        size = sizes[dim]
        if kind == _LABEL:
            labelled: Selection = self._args[1]
            if labelled._kind != _ANY:  # filters nothing: no label source yet
                return labelled._eval(dim, base, sizes, blocks, rng)
            indices: Iterable[int] = (rng.randrange(size),) if size else ()
            inner: Selection = labelled._args[0]
        else:
            inner = self._args[-1]
            if kind == _ALL:
                indices = range(size)
            elif kind == _RANGE:
                start, end, step = self._args[0]
                indices = range(start, size if end is None else min(end, size), step)
            elif kind == _ANY:
                indices = (rng.randrange(size),) if size else ()
            else:  # _FIRST
                for i in range(size):
                    found = inner._eval(dim + 1, base * size + i, sizes, blocks, rng)
                    if found:
                        return found
                return []
        out: list[int] = []
        for i in indices:
            out.extend(inner._eval(dim + 1, base * size + i, sizes, blocks, rng))
        return out

    def _expand(self, dim: int, ndim: int) -> Selection:
        """Monarch's ``canonicalize_to_dimensions``: pad a leaf left above the last
        dimension (``True``, ``False``, ``Any(True)``) to the slice's depth."""
        kind = self._kind
        if dim < ndim and (
            kind in (_TRUE, _FALSE) or (kind == _ANY and self._args[0]._kind == _TRUE)
        ):
            wrap = _ANY if kind == _ANY else _ALL
            out = Selection._FALSE_NODE if kind == _FALSE else Selection._TRUE_NODE
            for _ in range(dim, ndim):
                out = Selection._node(wrap, out)
            return out
        if kind in _DESCENDING:
            return Selection._node(kind, self._args[0]._expand(dim + 1, ndim))
        if kind == _RANGE:
            return Selection._node(kind, self._args[0], self._args[1]._expand(dim + 1, ndim))
        if kind in (_INTERSECTION, _UNION):
            return Selection._node(
                kind, self._args[0]._expand(dim, ndim), self._args[1]._expand(dim, ndim)
            )
        return self

    # -- value semantics ----------------------------------------------------

    def __repr__(self) -> str:
        """Rust's ``Debug`` form, as Monarch's ``repr`` shows it: ``All(Range(Range(1,
        Some(3), 1), True))``."""
        kind = self._kind
        if kind in (_TRUE, _FALSE):
            return kind
        if kind == _RANGE:
            return f"Range({_range_debug(self._args[0])}, {self._args[1]!r})"
        if kind == _LABEL:
            labels = ", ".join(f"Value({_rust_debug_str(s)})" for s in self._args[0])
            return f"Label([{labels}], {self._args[1]!r})"
        return f"{kind}({', '.join(repr(a) for a in self._args)})"

    def _pretty(self) -> str:
        """Rust's ``Display`` (constructor) form, used in error messages:
        ``all(range(1:3:1, true_()))``."""
        kind = self._kind
        if kind in (_TRUE, _FALSE):
            return f"{kind.lower()}_()"
        if kind == _RANGE:
            start, end, step = self._args[0]
            r = f"{start}::{step}" if end is None else f"{start}:{end}:{step}"
            return f"range({r}, {self._args[1]._pretty()})"
        if kind == _LABEL:
            labels = ", ".join(f'"{s}"' for s in self._args[0])
            return f"label([{labels}], {self._args[1]._pretty()})"
        return f"{kind.lower()}({', '.join(a._pretty() for a in self._args)})"

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Selection is immutable; cannot set {name!r}")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Selection):
            return NotImplemented
        return self is other or (self._kind == other._kind and self._args == other._args)

    def __hash__(self) -> int:
        return hash((self._kind, self._args))

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (_rebuild, (self._kind, self._args))


def _rebuild(kind: str, args: tuple[Any, ...]) -> Selection:
    """Unpickle a node (``Selection.__reduce__``)."""
    return Selection._node(kind, *args)


Selection._TRUE_NODE = Selection._node(_TRUE)
Selection._FALSE_NODE = Selection._node(_FALSE)


def _check(sel: object) -> Selection:
    if not isinstance(sel, Selection):
        raise TypeError(f"expected a Selection, got {sel!r}")
    return sel


def _inner(inner: Selection | None) -> Selection:
    return Selection._TRUE_NODE if inner is None else _check(inner)


def _as_range(r: object) -> _RangeT:
    """``(start, end or None, step)`` of an index, ``range`` or ``slice``."""
    if isinstance(r, range):
        start, end, step = r.start, r.stop, r.step
    elif isinstance(r, slice):
        start = 0 if r.start is None else r.start
        end = r.stop
        step = 1 if r.step is None else r.step
    elif isinstance(r, bool) or not hasattr(r, "__index__"):
        raise TypeError(
            f"a selection range is an index, a range or a slice, got {r!r}. "
            f"Probably you meant slice(start, end, step)"
        )
    else:
        start = as_nonneg_int(r, "selection index")
        return (start, start + 1, 1)
    start = as_nonneg_int(start, f"the start of {r!r}")
    if end is not None:
        end = as_nonneg_int(end, f"the end of {r!r}")
    step = as_nonneg_int(step, f"the step of {r!r}")
    if step == 0:
        raise ValueError(f"the step of {r!r} must be >= 1")
    return (start, end, step)


def _range_debug(r: _RangeT) -> str:
    start, end, step = r
    return f"Range({start}, {'None' if end is None else f'Some({end})'}, {step})"


def _rust_debug_str(s: str) -> str:
    """A str quoted as Rust's ``Debug`` for ``String`` quotes it."""
    out = ['"']
    for ch in s:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\0":
            out.append("\\0")
        elif not ch.isprintable():
            out.append(f"\\u{{{ord(ch):x}}}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _as_slice(where: object) -> Slice:
    if isinstance(where, Slice):
        return where
    if isinstance(where, Shape):
        return where.ndslice
    if isinstance(where, Region):
        return where.slice()
    raise TypeError(
        f"Selection.eval needs a Slice, Shape or Region, got {where!r}. "
        f"Probably you meant mesh.region"
    )


class _Parser:
    """A recursive-descent parser of Monarch's grammar (``parse.rs``), whitespace ignored.

    ``pos`` indexes the text without whitespace; errors quote the position in the
    text as given."""

    def __init__(self, text: str) -> None:
        self.text = text
        # Each kept character with its index in ``text``.
        self.where = [i for i, ch in enumerate(text) if not ch.isspace()]
        self.s = "".join(text[i] for i in self.where)
        self.pos = 0

    def parse(self) -> Selection:
        sel = self.expression()
        if self.pos != len(self.s):
            self.fail("'|', '&', ',' or the end of the expression")
        return sel

    def fail(self, expected: str) -> None:
        if self.pos < len(self.s):
            at = self.where[self.pos]
            found = f"found {self.s[self.pos]!r}"
        else:
            at = len(self.text)
            found = "found the end of the input"
        raise ValueError(
            f"invalid selection {self.text!r}: at position {at} expected {expected}, {found}"
        )

    def peek(self) -> str:
        return self.s[self.pos] if self.pos < len(self.s) else ""

    def expression(self) -> Selection:
        sel = self.intersection()
        while self.peek() == "|":
            self.pos += 1
            sel = Selection._node(_UNION, sel, self.intersection())
        return sel

    def intersection(self) -> Selection:
        sel = self.chain()
        while self.peek() == "&":
            self.pos += 1
            sel = Selection._node(_INTERSECTION, sel, self.chain())
        return sel

    def chain(self) -> Selection:
        dims = [self.group()]
        while self.peek() == ",":
            self.pos += 1
            dims.append(self.group())
        out = Selection._TRUE_NODE
        for dim in reversed(dims):
            out = _nest(dim, out)
        return out

    def group(self) -> Selection:
        ch = self.peek()
        if ch == "(":
            self.pos += 1
            sel = self.expression()
            if self.peek() != ")":
                self.fail("')', '|', '&' or ','")
            self.pos += 1
            return sel
        if ch == "*":
            self.pos += 1
            return Selection._node(_ALL, Selection._TRUE_NODE)
        if ch == "?":
            self.pos += 1
            return Selection._node(_ANY, Selection._TRUE_NODE)
        if ch in _DIGITS or ch == ":":
            start = self.number() if ch != ":" else 0
            if self.peek() != ":":  # an index
                return Selection._node(_RANGE, (start, start + 1, 1), Selection._TRUE_NODE)
            self.pos += 1
            end = self.number() if self.peek() in _DIGITS else None
            step = 1
            if self.peek() == ":":
                self.pos += 1
                if self.peek() not in _DIGITS:
                    self.fail("the step of the range (a number)")
                at = self.pos
                step = self.number()
                if step == 0:
                    self.pos = at
                    self.fail("a step of at least 1")
            return Selection._node(_RANGE, (start, end, step), Selection._TRUE_NODE)
        self.fail("'(', '*', '?', a number or ':'")
        raise AssertionError("unreachable")

    def number(self) -> int:
        begin = self.pos
        while self.pos < len(self.s) and self.s[self.pos] in _DIGITS:
            self.pos += 1
        return int(self.s[begin : self.pos])


def _nest(dim: Selection, tail: Selection) -> Selection:
    """Put ``tail`` under ``dim``'s innermost ``True``: ``,`` descends a dimension
    (``parse.rs``'s ``nest``); unions and intersections nest both branches."""
    kind = dim._kind
    if kind == _TRUE:
        return tail
    if kind == _FALSE:
        return dim
    if kind in _DESCENDING:
        return Selection._node(kind, _nest(dim._args[0], tail))
    if kind == _RANGE:
        return Selection._node(kind, dim._args[0], _nest(dim._args[1], tail))
    # Union or Intersection: the parser builds nothing else.
    return Selection._node(kind, _nest(dim._args[0], tail), _nest(dim._args[1], tail))
