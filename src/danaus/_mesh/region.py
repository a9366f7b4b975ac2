"""Region: a hyper-rectangle of ranks in a possibly larger space (Monarch's ``Region``).

The same data as a ``Shape`` (labels over a ``Slice`` of base ranks), under
Monarch's other name and methods: ``labels``, ``slice()``, ``as_shape()`` and
``point_of_base_rank``, which maps a rank of the base space to its ``Point``
in the region::

    >>> base = Shape(["x", "y"], Slice.new_row_major([4, 2]))
    >>> region = base.select("x", slice(1, 3)).region  # base ranks 2, 3, 4, 5
    >>> dict(region.point_of_base_rank(4))
    {'x': 1, 'y': 0}
"""

from __future__ import annotations

from collections.abc import Sequence

from .extent import Extent, Point
from .shape import Shape
from .slice import Slice

__all__ = ["Region"]


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
