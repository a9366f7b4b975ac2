"""Slice: an immutable strided view ``offset + sum(coord[d] * strides[d])`` of global ranks.

A ``Slice`` names ``prod(sizes)`` distinct global ranks and enumerates them in
row-major order of their coordinates (the last dimension varies fastest).
It is the geometry underneath every ``Shape`` and mesh:

    >>> s = Slice(offset=0, sizes=[2, 3], strides=[3, 1])
    >>> list(s)
    [0, 1, 2, 3, 4, 5]
    >>> s.coordinates(4)
    [1, 1]

Invariant: a Slice never names a rank twice (construction raises ValueError
otherwise), so ``index`` and ``coordinates`` are well defined.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from typing import overload

from ._check import as_int, as_int_list, as_nonneg_int

__all__ = ["NDSlice", "Slice"]


class Slice:
    """A strided, row-major view of global ranks; immutable and hashable."""

    __slots__ = ("_lookup", "_offset", "_order", "_sizes", "_strides")

    _offset: int
    _sizes: tuple[int, ...]
    _strides: tuple[int, ...]
    # Dimensions of size > 1 sorted by decreasing stride when the layout is
    # "nested" (each stride exceeds the span of all smaller-stride dims), which
    # makes rank -> coordinates a greedy mixed-radix division. Otherwise None,
    # and ``_lookup`` maps every rank to its position instead.
    _order: tuple[int, ...] | None
    _lookup: dict[int, int] | None

    def __init__(self, offset: int, sizes: Sequence[int], strides: Sequence[int]) -> None:
        """Build a slice; TypeError for non-ints, ValueError for negative or mismatched values.

        Also raises ValueError when two coordinates would name the same rank.
        """
        off = as_nonneg_int(offset, "Slice offset")
        sz = as_int_list(sizes, "Slice sizes")
        st = as_int_list(strides, "Slice strides")
        if len(sz) != len(st):
            raise ValueError(
                f"Slice sizes {list(sz)!r} and strides {list(st)!r} must have the same "
                f"length (one stride per dimension)"
            )
        set_ = object.__setattr__
        set_(self, "_offset", off)
        set_(self, "_sizes", sz)
        set_(self, "_strides", st)
        set_(self, "_order", _nested_order(sz, st))
        set_(self, "_lookup", None)
        if self._order is None and math.prod(sz) > 0:
            lookup: dict[int, int] = {}
            for pos, rank in enumerate(self):
                if rank in lookup:
                    raise ValueError(
                        f"{self!r} names rank {rank} twice (positions {lookup[rank]} and "
                        f"{pos}); strides must not let two coordinates meet"
                    )
                lookup[rank] = pos
            set_(self, "_lookup", lookup)

    # -- construction -------------------------------------------------------

    @classmethod
    def new_row_major(cls, sizes: Sequence[int]) -> Slice:
        """Return the dense slice at offset 0 with row-major strides for ``sizes``.

        ``Slice.new_row_major([2, 3]) == Slice(offset=0, sizes=[2, 3], strides=[3, 1])``.
        Raises like the constructor.
        """
        sz = as_int_list(sizes, "Slice sizes")
        return cls(0, sz, row_major_strides(sz))

    @classmethod
    def from_list(cls, ranks: Sequence[int]) -> list[Slice]:
        """Return the fewest 1-d slices that, concatenated, enumerate ``ranks`` in order.

        A slice here is an arithmetic run with a positive step, so ``[1, 3, 5]``
        gives ``[Slice(offset=1, sizes=[3], strides=[2])]``. The cover is
        optimal: working back from the end, each slice is the longest run that
        ends there (the fewest slices for a prefix never decreases with its
        length, so taking the longest final run is never worse). A repeated or
        decreasing rank starts a new slice. ``[]`` gives ``[]``.
        Raises TypeError for non-int ranks, ValueError for negative ones.
        """
        rs = as_int_list(ranks, "ranks")
        # start[j]: first index of the longest increasing arithmetic run ending at j.
        start: list[int] = []
        for j in range(len(rs)):
            if j == 0 or rs[j] <= rs[j - 1]:
                start.append(j)
            elif j >= 2 and start[j - 1] <= j - 2 and rs[j] - rs[j - 1] == rs[j - 1] - rs[j - 2]:
                start.append(start[j - 1])
            else:
                start.append(j - 1)
        out: list[Slice] = []
        end = len(rs)
        while end > 0:
            first = start[end - 1]
            n = end - first
            step = rs[first + 1] - rs[first] if n > 1 else 1
            out.append(cls(rs[first], [n], [step]))
            end = first
        out.reverse()
        return out

    # -- attributes ---------------------------------------------------------

    @property
    def offset(self) -> int:
        """The rank at coordinates all zero."""
        return self._offset

    @property
    def sizes(self) -> list[int]:
        """The number of coordinates along each dimension (a new list, as Monarch's)."""
        return list(self._sizes)

    @property
    def strides(self) -> list[int]:
        """The rank distance between neighbours along each dimension (a new list, as
        Monarch's)."""
        return list(self._strides)

    @property
    def ndim(self) -> int:
        """The number of dimensions."""
        return len(self._sizes)

    # -- enumeration --------------------------------------------------------

    def __len__(self) -> int:
        return math.prod(self._sizes)

    def __iter__(self) -> Iterator[int]:
        """Yield the ranks in row-major order of their coordinates."""
        off, st = self._offset, self._strides
        for coords in itertools.product(*(range(n) for n in self._sizes)):
            yield off + sum(c * s for c, s in zip(coords, st, strict=True))

    def __contains__(self, rank: object) -> bool:
        """Whether global ``rank`` is in the slice; False for anything that is not an int."""
        try:
            r = as_int(rank, "rank")
        except TypeError:
            return False
        return self._position(r) is not None

    @overload
    def __getitem__(self, i: int) -> int: ...

    @overload
    def __getitem__(self, i: slice) -> tuple[int, ...]: ...

    def __getitem__(self, i: int | slice) -> int | tuple[int, ...]:
        """Return the ``i``-th rank (IndexError unless ``0 <= i < len(self)``), or for a
        Python slice the tuple of those ranks in iteration order (as Monarch's
        ``NDSlice``: ``s[0:4]``, ``s[::2]``)."""
        if isinstance(i, slice):
            return tuple(self.get(k) for k in range(*i.indices(len(self))))
        return self.get(i)

    def get(self, i: int) -> int:
        """Return the ``i``-th rank in iteration order.

        Raises TypeError for a non-int, IndexError unless ``0 <= i < len(self)``
        (negative indices are refused: a rank position is never "from the end").
        """
        idx = as_int(i, "Slice index")
        n = len(self)
        if not 0 <= idx < n:
            raise IndexError(f"Slice index {i!r} out of range: the slice has {n} ranks")
        coords = self._unravel(idx)
        return self._offset + sum(c * s for c, s in zip(coords, self._strides, strict=True))

    def nditem(self, coords: Sequence[int]) -> int:
        """Return the rank at ``coords``.

        Raises ValueError when the number of coordinates is not ``ndim``,
        IndexError when a coordinate is negative or not below its size.
        """
        cs = [as_int(c, "Slice coordinate") for c in coords]
        if len(cs) != len(self._sizes):
            raise ValueError(
                f"expected {len(self._sizes)} coordinates for sizes {list(self._sizes)!r}, "
                f"got {list(coords)!r}"
            )
        for d, (c, n) in enumerate(zip(cs, self._sizes, strict=True)):
            if not 0 <= c < n:
                raise IndexError(f"coordinate {c!r} of dimension {d} out of range: size is {n}")
        return self._offset + sum(c * s for c, s in zip(cs, self._strides, strict=True))

    def coordinates(self, rank: int) -> list[int]:
        """Return the coordinates of global ``rank``; ValueError if the slice lacks it."""
        pos = self._position(as_int(rank, "rank"))
        if pos is None:
            raise ValueError(f"rank {rank!r} is not in {self!r}")
        return self._unravel(pos)

    def _unravel(self, pos: int) -> list[int]:
        """The coordinates of position ``pos`` in row-major iteration order."""
        coords = []
        for size in reversed(self._sizes):
            pos, c = divmod(pos, size)
            coords.append(c)
        coords.reverse()
        return coords

    def index(self, rank: int) -> int:
        """Return the position of global ``rank`` in iteration order; ValueError if absent."""
        pos = self._position(as_int(rank, "rank"))
        if pos is None:
            raise ValueError(f"rank {rank!r} is not in {self!r}")
        return pos

    def _position(self, rank: int) -> int | None:
        """Return the iteration position of ``rank``, or None when it is not in the slice."""
        if self._lookup is not None:
            return self._lookup.get(rank)
        if self._order is None:  # empty slice
            return None
        rest = rank - self._offset
        if rest < 0:
            return None
        coords = [0] * len(self._sizes)
        for d in self._order:
            c, rest = divmod(rest, self._strides[d])
            if c >= self._sizes[d]:
                return None
            coords[d] = c
        if rest != 0:
            return None
        pos = 0
        for c, n in zip(coords, self._sizes, strict=True):
            pos = pos * n + c
        return pos

    # -- value semantics ----------------------------------------------------

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Slice is immutable; cannot set {name!r}")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Slice):
            return NotImplemented
        return (self._offset, self._sizes, self._strides) == (
            other._offset,
            other._sizes,
            other._strides,
        )

    def __hash__(self) -> int:
        return hash((Slice, self._offset, self._sizes, self._strides))

    def __reduce__(self) -> tuple[type[Slice], tuple[int, list[int], list[int]]]:
        return (Slice, (self._offset, list(self._sizes), list(self._strides)))

    def __repr__(self) -> str:
        return (
            f"Slice(offset={self._offset}, sizes={list(self._sizes)}, "
            f"strides={list(self._strides)})"
        )


NDSlice = Slice
"""Monarch's name for [`Slice`][danaus.Slice]: the same class."""


def row_major_strides(sizes: Sequence[int]) -> tuple[int, ...]:
    """Return the strides that lay ``sizes`` out densely, last dimension fastest."""
    strides = []
    acc = 1
    for n in reversed(sizes):
        strides.append(acc)
        acc *= n
    return tuple(reversed(strides))


def _nested_order(sizes: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, ...] | None:
    """Return dims of size > 1 by decreasing stride if the layout is nested, else None.

    Nested means each stride exceeds the largest offset reachable with the
    smaller-stride dimensions, so ranks are distinct and decode greedily.
    Returns None for an empty slice too (it has no ranks to decode).
    """
    if 0 in sizes:
        return None
    order = sorted((d for d, n in enumerate(sizes) if n > 1), key=lambda d: -strides[d])
    span = 0
    for d in reversed(order):
        if strides[d] <= span:
            return None
        span += strides[d] * (sizes[d] - 1)
    return tuple(order)
