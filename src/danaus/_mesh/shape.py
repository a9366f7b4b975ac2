"""Extent, Point, Shape and Region: named dimensions, and the ranks they name.

One module: each type converts to the others (``Extent.region``, ``Shape.extent``,
``Shape.region``, ``Region.as_shape``, ``Region.extent``...).

``Extent`` is an immutable ordered mapping from dimension name to size;
``Point`` is a rank of an extent seen as a mapping from name to coordinate
(row-major: the last dimension varies fastest)::

    >>> e = Extent(["hosts", "gpus"], [2, 4])
    >>> p = Point(3, e)
    >>> dict(p), str(p)
    ({'hosts': 0, 'gpus': 3}, "{'hosts': 0/2, 'gpus': 3/4}")

A ``Shape`` pairs one label per dimension with a ``Slice`` of global ranks;
``at``/``select`` cut it down. Cutting a shape keeps global offsets and strides,
so a shape cut from a cut shape names the same global ranks as the composed cut:

    >>> s = Shape(["hosts", "gpus"], Slice.new_row_major([2, 4]))
    >>> s.at("hosts", 1).ndslice
    Slice(offset=4, sizes=[4], strides=[1])
    >>> s.select("gpus", slice(1, None, 2)).ranks()
    [1, 3, 5, 7]

A ``Region`` (Monarch's name) is a hyper-rectangle of ranks in a possibly larger
space: the same data as a ``Shape`` (labels over a ``Slice`` of base ranks), under
Monarch's other name and methods: ``labels``, ``slice()``, ``as_shape()`` and
``point_of_base_rank``, which maps a rank of the base space to its ``Point`` in
the region:

    >>> base = Shape(["x", "y"], Slice.new_row_major([4, 2]))
    >>> region = base.select("x", slice(1, 3)).region  # base ranks 2, 3, 4, 5
    >>> dict(region.point_of_base_rank(4))
    {'x': 1, 'y': 0}
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from typing import SupportsIndex

from ._check import as_int, as_int_list, as_labels, unknown_dim_message
from .slice import Slice

__all__ = ["Extent", "Point", "Region", "Shape"]

_PySlice = slice


class Extent(Mapping[str, int]):
    """An immutable, ordered mapping of dimension name to size."""

    __slots__ = ("_labels", "_sizes")

    _labels: tuple[str, ...]
    _sizes: tuple[int, ...]

    def __init__(self, labels: Sequence[str], sizes: Sequence[int]) -> None:
        """Build an extent.

        Raises TypeError for a non-string label or a non-int size, ValueError
        for a repeated label, a negative size, or ``len(labels) != len(sizes)``.
        """
        ls = as_labels(labels)
        sz = as_int_list(sizes, "Extent sizes")
        if len(ls) != len(sz):
            raise ValueError(
                f"Extent needs one size per label, got labels {list(ls)!r} and sizes {list(sz)!r}"
            )
        object.__setattr__(self, "_labels", ls)
        object.__setattr__(self, "_sizes", sz)

    @property
    def labels(self) -> list[str]:
        """The dimension names, outermost first."""
        return list(self._labels)

    @property
    def sizes(self) -> list[int]:
        """The dimension sizes, in label order."""
        return list(self._sizes)

    @property
    def region(self) -> Region:
        """The extent as Monarch's ``Region``: its labels over base ranks 0..n-1, row-major."""
        return Region(self._labels, Slice.new_row_major(self._sizes))

    @property
    def nelements(self) -> int:
        """The number of points: the product of the sizes (1 for no dimensions)."""
        return math.prod(self._sizes)

    def __getitem__(self, label: str) -> int:
        """Return the size of ``label``; KeyError naming the valid labels if unknown."""
        try:
            return self._sizes[self._labels.index(label)]
        except ValueError:
            raise KeyError(unknown_dim_message(label, self._labels)) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._labels)

    def __len__(self) -> int:
        """The number of dimensions (not of points: see ``nelements``)."""
        return len(self._labels)

    def __contains__(self, label: object) -> bool:
        return label in self._labels

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Extent is immutable; cannot set {name!r}")

    def __eq__(self, other: object) -> bool:
        """Equal to another Extent with the same labels and sizes in the same order."""
        if not isinstance(other, Extent):
            return NotImplemented
        return (self._labels, self._sizes) == (other._labels, other._sizes)

    def __hash__(self) -> int:
        return hash((Extent, self._labels, self._sizes))

    def __reduce__(self) -> tuple[type[Extent], tuple[list[str], list[int]]]:
        return (Extent, (list(self._labels), list(self._sizes)))

    def __repr__(self) -> str:
        return f"Extent({dict(zip(self._labels, self._sizes, strict=True))!r})"


class Point(Mapping[str, int]):
    """Rank ``rank`` of ``extent``, as an immutable mapping of dimension name to coordinate."""

    __slots__ = ("_coords", "_extent", "_rank")

    _rank: int
    _extent: Extent
    _coords: tuple[int, ...]

    def __init__(self, rank: int, extent: Extent) -> None:
        """Build a point.

        Raises TypeError if ``extent`` is not an Extent or ``rank`` not an int,
        IndexError unless ``0 <= rank < extent.nelements``.
        """
        if not isinstance(extent, Extent):
            hint = ""
            if isinstance(extent, Mapping):
                hint = f" Probably you meant Extent({list(extent)!r}, {list(extent.values())!r})."
            raise TypeError(f"Point needs an Extent, got {extent!r}.{hint}")
        r = as_int(rank, "Point rank")
        n = extent.nelements
        if not 0 <= r < n:
            raise IndexError(f"Point rank {rank!r} out of range for {extent!r} of {n} elements")
        coords = []
        rest = r
        for size in reversed(extent.sizes):
            rest, c = divmod(rest, size)
            coords.append(c)
        coords.reverse()
        object.__setattr__(self, "_rank", r)
        object.__setattr__(self, "_extent", extent)
        object.__setattr__(self, "_coords", tuple(coords))

    @property
    def rank(self) -> int:
        """The row-major index of this point in its extent."""
        return self._rank

    @property
    def extent(self) -> Extent:
        """The extent this point lies in."""
        return self._extent

    def size(self, label: str) -> int:
        """Return the size of dimension ``label``; KeyError naming the valid labels if unknown."""
        return self._extent[label]

    def __getitem__(self, label: str) -> int:
        """Return the coordinate along ``label``; KeyError naming the valid labels if unknown."""
        try:
            return self._coords[self._extent._labels.index(label)]
        except ValueError:
            raise KeyError(unknown_dim_message(label, self._extent._labels)) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._extent._labels)

    def __len__(self) -> int:
        return len(self._coords)

    def __contains__(self, label: object) -> bool:
        return label in self._extent._labels

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Point is immutable; cannot set {name!r}")

    def __eq__(self, other: object) -> bool:
        """Equal to another Point with the same rank in an equal extent."""
        if not isinstance(other, Point):
            return NotImplemented
        return (self._rank, self._extent) == (other._rank, other._extent)

    def __hash__(self) -> int:
        return hash((Point, self._rank, self._extent))

    def __reduce__(self) -> tuple[type[Point], tuple[int, Extent]]:
        return (Point, (self._rank, self._extent))

    def __str__(self) -> str:
        parts = (
            f"{label!r}: {c}/{n}"
            for label, c, n in zip(
                self._extent._labels, self._coords, self._extent._sizes, strict=True
            )
        )
        return "{" + ", ".join(parts) + "}"

    def __repr__(self) -> str:
        return f"Point({self})"


class Shape:
    """Labelled dimensions over a strided view of global ranks; immutable and hashable."""

    __slots__ = ("_labels", "_slice")

    _labels: tuple[str, ...]
    _slice: Slice

    def __init__(self, labels: Sequence[str], slice: Slice) -> None:
        """Build a shape.

        Raises TypeError if ``slice`` is not a Slice or a label is not a str,
        ValueError for a repeated label or when ``len(labels) != slice.ndim``.
        """
        ls = as_labels(labels)
        if not isinstance(slice, Slice):
            raise TypeError(
                f"Shape needs a Slice, got {slice!r}. Probably you meant Slice.new_row_major(sizes)"
            )
        if len(ls) != slice.ndim:
            raise ValueError(
                f"Shape needs one label per dimension: got labels {list(ls)!r} "
                f"for {slice!r} with {slice.ndim} dimensions"
            )
        object.__setattr__(self, "_labels", ls)
        object.__setattr__(self, "_slice", slice)

    @classmethod
    def unity(cls) -> Shape:
        """Return the 0-dimensional shape holding the single rank 0."""
        return cls([], Slice(0, [], []))

    # -- attributes ---------------------------------------------------------

    @property
    def labels(self) -> list[str]:
        """The dimension names, outermost first."""
        return list(self._labels)

    @property
    def ndslice(self) -> Slice:
        """The global ranks, as a Slice."""
        return self._slice

    @property
    def extent(self) -> Extent:
        """The dimension sizes by name."""
        return Extent(self._labels, self._slice.sizes)

    @property
    def region(self) -> Region:
        """The same labels and slice as Monarch's ``Region``."""
        return Region(self._labels, self._slice)

    def __len__(self) -> int:
        """The number of ranks."""
        return len(self._slice)

    def ranks(self) -> list[int]:
        """Return the global ranks in row-major order of their coordinates."""
        return list(self._slice)

    def coordinates(self, rank: int) -> dict[str, int]:
        """Return the coordinates of global ``rank`` by label; ValueError if absent."""
        try:
            coords = self._slice.coordinates(rank)
        except ValueError:
            raise ValueError(f"rank {rank!r} is not in {self!r}") from None
        return dict(zip(self._labels, coords, strict=True))

    # -- cutting ------------------------------------------------------------

    def _dim(self, label: object) -> int:
        """Return the position of ``label``; TypeError listing the labels if unknown."""
        if isinstance(label, str) and label in self._labels:
            return self._labels.index(label)
        raise TypeError(unknown_dim_message(label, self._labels))

    def at(self, label: str, index: SupportsIndex) -> Shape:
        """Return this shape with dimension ``label`` fixed at ``index`` and removed.

        Raises TypeError for an unknown label or a non-int index, IndexError
        unless ``0 <= index < size``.
        """
        d = self._dim(label)
        i = as_int(index, f"index for dimension {label!r}")
        size = self._slice.sizes[d]
        if not 0 <= i < size:
            raise IndexError(
                f"index {index!r} out of range for dimension {label!r} of size {size}; "
                f"valid indices are 0..{size - 1}"
                if size
                else f"index {index!r} out of range for dimension {label!r} of size 0"
            )
        s = self._slice
        return Shape(
            self._labels[:d] + self._labels[d + 1 :],
            Slice(
                s.offset + i * s.strides[d],
                s.sizes[:d] + s.sizes[d + 1 :],
                s.strides[:d] + s.strides[d + 1 :],
            ),
        )

    def select(self, label: str, selector: slice) -> Shape:
        """Return this shape with dimension ``label`` cut to ``selector``, keeping the dim.

        ``selector`` is a Python slice: start and stop follow list slicing
        (negative counts from the end, out-of-range is clamped), and the step
        multiplies the stride. Raises TypeError for an unknown label or a
        non-slice, ValueError for a step that is zero or negative.
        """
        d = self._dim(label)
        if not isinstance(selector, _PySlice):
            hint = ""
            if isinstance(selector, int) and not isinstance(selector, bool):
                hint = f" Probably you meant at({label!r}, {selector!r})."
            raise TypeError(
                f"select needs a slice for dimension {label!r}, got {selector!r}.{hint}"
            )
        if selector.step is not None:
            step = as_int(selector.step, f"slice step for dimension {label!r}")
            if step <= 0:
                raise ValueError(
                    f"slice step must be positive, got {selector!r} for dimension {label!r}"
                )
        s = self._slice
        size = s.sizes[d]
        try:
            start, stop, step = selector.indices(size)
        except TypeError:
            raise TypeError(
                f"slice bounds must be ints or None, got {selector!r} for dimension {label!r}"
            ) from None
        count = len(range(start, stop, step))
        return Shape(
            self._labels,
            Slice(
                s.offset + (start * s.strides[d] if count else 0),
                (*s.sizes[:d], count, *s.sizes[d + 1 :]),
                (*s.strides[:d], s.strides[d] * step, *s.strides[d + 1 :]),
            ),
        )

    def index(self, **coords: int) -> Shape:
        """Return this shape with every given dimension fixed and removed (``at`` for each).

        Raises like ``at``.
        """
        shape = self
        for label, i in coords.items():
            shape = shape.at(label, i)
        return shape

    # -- value semantics ----------------------------------------------------

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Shape is immutable; cannot set {name!r}")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Shape):
            return NotImplemented
        return (self._labels, self._slice) == (other._labels, other._slice)

    def __hash__(self) -> int:
        return hash((Shape, self._labels, self._slice))

    def __reduce__(self) -> tuple[type[Shape], tuple[list[str], Slice]]:
        return (Shape, (list(self._labels), self._slice))

    def __repr__(self) -> str:
        return f"Shape(labels={list(self._labels)!r}, slice={self._slice!r})"


class Region:
    """Labelled dimensions over a ``Slice`` of base ranks; immutable and hashable."""

    __slots__ = ("_shape",)

    _shape: Shape

    def __init__(self, labels: Sequence[str], slice: Slice) -> None:
        """Raises what ``Shape(labels, slice)`` raises for a mismatch or a bad label."""
        object.__setattr__(self, "_shape", Shape(labels, slice))

    @property
    def labels(self) -> list[str]:
        """The dimension names, outermost first."""
        return self._shape.labels

    def slice(self) -> Slice:
        """The base ranks of the region, as a ``Slice``."""
        return self._shape.ndslice

    @property
    def extent(self) -> Extent:
        """The dimension sizes by name."""
        return self._shape.extent

    def as_shape(self) -> Shape:
        """The region as a ``Shape`` (the same labels and slice)."""
        return self._shape

    def point_of_base_rank(self, rank: int) -> Point:
        """The ``Point`` of this region at base rank ``rank``; ValueError if the region
        does not hold that rank."""
        return Point(self._shape.ndslice.index(rank), self._shape.extent)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Region is immutable")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Region):
            return NotImplemented
        return self._shape == other._shape

    def __hash__(self) -> int:
        return hash(("Region", self._shape))

    def __reduce__(self) -> tuple[type[Region], tuple[list[str], Slice]]:
        return (Region, (self._shape.labels, self._shape.ndslice))

    def __repr__(self) -> str:
        return f"Region(labels={self._shape.labels!r}, slice={self._shape.ndslice!r})"
