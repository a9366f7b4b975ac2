"""Extent and Point: the named sizes of a mesh, and one rank's named coordinates in it.

``Extent`` is an immutable ordered mapping from dimension name to size;
``Point`` is a rank of an extent seen as a mapping from name to coordinate
(row-major: the last dimension varies fastest)::

    >>> e = Extent(["hosts", "gpus"], [2, 4])
    >>> p = Point(3, e)
    >>> dict(p), str(p)
    ({'hosts': 0, 'gpus': 3}, "{'hosts': 0/2, 'gpus': 3/4}")
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

from ._check import as_int, as_int_list, as_labels, unknown_dim_message

if TYPE_CHECKING:
    from .region import Region

__all__ = ["Extent", "Point"]


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
        from .region import Region  # region builds on extent
        from .slice import Slice

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
