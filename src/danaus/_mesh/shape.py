"""Shape: named dimensions over a Slice of global ranks; ``at``/``select`` cut it down.

A ``Shape`` pairs one label per dimension with a ``Slice``. Cutting a shape
keeps global offsets and strides, so a shape cut from a cut shape names the
same global ranks as the composed cut::

    >>> s = Shape(["hosts", "gpus"], Slice.new_row_major([2, 4]))
    >>> s.at("hosts", 1).ndslice
    Slice(offset=4, sizes=[4], strides=[1])
    >>> s.select("gpus", slice(1, None, 2)).ranks()
    [1, 3, 5, 7]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, SupportsIndex

from ._check import as_int, as_labels, unknown_dim_message
from .extent import Extent
from .slice import Slice

if TYPE_CHECKING:
    from .region import Region

__all__ = ["Shape"]

_PySlice = slice


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
        from .region import Region  # region builds on shape

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
