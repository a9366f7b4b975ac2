"""ValueMesh: one value per rank of a Shape, sliceable like any mesh (MeshTrait).

Values are held in local order, that of ``shape.ranks()``; slicing maps the
chosen global ranks back to their positions, so slices of slices pick the
same values as the composed slice:

    >>> vm = ValueMesh(Shape(["hosts", "gpus"], Slice.new_row_major([2, 2])), "abcd")
    >>> vm.slice(hosts=1).values()
    ['c', 'd']
    >>> vm.item(hosts=1, gpus=0)
    'c'
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from pprint import pformat
from textwrap import indent
from typing import Generic, TypeVar

from ._check import as_int, as_tuple, unknown_dim_message
from .shape import Point, Shape
from .trait import MeshTrait

__all__ = ["ValueMesh"]

T = TypeVar("T")

_MISSING = object()


class MissingCoordinateError(KeyError, ValueError):
    """``item()`` was not given a coordinate for a dimension of size other than 1.

    A ``KeyError``, as in Monarch (whose ``item`` looks each label up in its
    keyword arguments); also a ``ValueError``, which danaus raised before.
    """

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class _Shown:
    """Renders as the given text in ``pformat`` (a Point as Monarch prints it)."""

    __slots__ = ("_text",)

    def __init__(self, text: str) -> None:
        self._text = text

    def __repr__(self) -> str:
        return self._text


def _extent_text(labels: Sequence[str], sizes: Sequence[int]) -> str:
    """An extent as Monarch's ``Extent`` displays it: ``{hosts: 2, gpus: 4}`` (a label
    that is not an identifier is quoted)."""
    shown = (
        f"{label if label.isidentifier() else json.dumps(label)}: {n}"
        for label, n in zip(labels, sizes, strict=True)
    )
    return "{" + ", ".join(shown) + "}"


class ValueMesh(MeshTrait, Generic[T]):
    """An immutable mesh of values, one per rank, in local (row-major) order."""

    __slots__ = ("_mesh_shape", "_values")

    _mesh_shape: Shape
    _values: tuple[T, ...]

    def __init__(self, shape: Shape, values: Sequence[T]) -> None:
        """Build a mesh giving ``values[i]`` to the ``i``-th rank of ``shape.ranks()``.

        Raises TypeError if ``shape`` is not a Shape or ``values`` not iterable,
        ValueError when ``len(values) != len(shape)``.
        """
        if not isinstance(shape, Shape):
            raise TypeError(
                f"ValueMesh needs a Shape, got {shape!r}. Probably you meant "
                f"Shape(labels, Slice.new_row_major(sizes))"
            )
        vals: tuple[T, ...] = as_tuple(values, "ValueMesh values must be a sequence")
        if len(vals) != len(shape):
            raise ValueError(
                f"ValueMesh needs one value per rank: {shape.extent!r} has {len(shape)} "
                f"ranks but got {len(vals)} values"
            )
        self._mesh_shape = shape
        self._values = vals

    @classmethod
    def from_indexed(cls, shape: Shape, pairs: Iterable[tuple[int, T]]) -> ValueMesh[T]:
        """Build a mesh from ``(local index, value)`` pairs; a later pair for an index wins.

        Raises TypeError for a non-int index, ValueError for an index outside
        ``0..len(shape)-1`` or when some index has no value.
        """
        n = len(shape)
        slots: list[object] = [_MISSING] * n
        for i, value in pairs:
            idx = as_int(i, "from_indexed index")
            if not 0 <= idx < n:
                raise ValueError(
                    f"from_indexed index {i!r} out of range: {shape.extent!r} has local "
                    f"indices 0..{n - 1}"
                )
            slots[idx] = value
        missing = [i for i, v in enumerate(slots) if v is _MISSING]
        if missing:
            shown = missing[:10]
            more = f" and {len(missing) - 10} more" if len(missing) > 10 else ""
            raise ValueError(f"from_indexed got no value for local indices {shown!r}{more}")
        return cls(shape, slots)  # type: ignore[arg-type]  # no _MISSING remains

    # -- MeshTrait ----------------------------------------------------------

    @property
    def _shape(self) -> Shape:
        return self._mesh_shape

    def _new_with_shape(self, shape: Shape) -> ValueMesh[T]:
        here = self._mesh_shape.ndslice
        try:
            values = [self._values[here.index(rank)] for rank in shape.ranks()]
        except ValueError:
            raise ValueError(f"{shape!r} is not part of this mesh's {self._mesh_shape!r}") from None
        return ValueMesh(shape, values)

    # -- values -------------------------------------------------------------

    def item(self, **coords: int) -> T:
        """Return the value at ``coords``; every dim of size other than 1 must be given.

        ``mesh.item(hosts=0, gpus=3)``; ``mesh.item()`` on a single-value mesh.
        Raises KeyError for a coordinate naming no dim, ``MissingCoordinateError``
        (a KeyError, as Monarch raises, and a ValueError) when a dim is missing,
        TypeError for a non-int, IndexError for an out-of-range one.
        """
        extent = self._mesh_shape.extent
        for label in coords:
            if label not in extent:
                raise KeyError(
                    f"item() got an extra coordinate: {unknown_dim_message(label, extent.labels)}"
                )
        missing = [label for label, n in extent.items() if label not in coords and n != 1]
        if missing:
            raise MissingCoordinateError(
                f"item() needs a coordinate for {missing!r} of mesh {dict(extent)!r}; e.g. "
                f"item({', '.join(f'{m}=0' for m in missing)}), or slice() for many values"
            )
        pos = 0
        for label, n in extent.items():
            c = as_int(coords.get(label, 0), f"coordinate {label!r}")
            if not 0 <= c < n:
                raise IndexError(f"coordinate {label}={c!r} out of range: size is {n}")
            pos = pos * n + c
        return self._values[pos]

    def items(self) -> Iterator[tuple[Point, T]]:
        """Yield ``(Point, value)`` in local rank order; points are local to this mesh."""
        extent = self._mesh_shape.extent
        for i, value in enumerate(self._values):
            yield Point(i, extent), value

    def __iter__(self) -> Iterator[tuple[Point, T]]:
        """Same as ``items()``."""
        return self.items()

    def values(self) -> list[T]:
        """Return the values in local rank order."""
        return list(self._values)

    def get(self, i: int) -> T:
        """Return the value at local index ``i``; ValueError unless ``0 <= i < len(self)``."""
        idx = as_int(i, "ValueMesh index")
        if not 0 <= idx < len(self._values):
            raise ValueError(
                f"ValueMesh index {i!r} out of range: local indices are 0..{len(self._values) - 1}"
            )
        return self._values[idx]

    # -- value semantics ----------------------------------------------------

    def __eq__(self, other: object) -> bool:
        """Equal to a ValueMesh with an equal extent and equal values (global ranks ignored)."""
        if not isinstance(other, ValueMesh):
            return NotImplemented
        return bool(
            self._mesh_shape.extent == other._mesh_shape.extent and self._values == other._values
        )

    __hash__ = None  # type: ignore[assignment]  # values may be unhashable

    def __reduce__(self) -> tuple[type[ValueMesh[T]], tuple[Shape, list[T]]]:
        return (ValueMesh, (self._mesh_shape, list(self._values)))

    def __repr__(self) -> str:
        """What Monarch prints: the extent, then one ``(point, value)`` pair a line
        (``pprint.pformat`` of the pairs, so a short mesh fits on one line)."""
        extent = self._mesh_shape.extent
        pairs = tuple((_Shown(str(point)), value) for point, value in self.items())
        body = indent(pformat(pairs), "  ")
        return f"ValueMesh({_extent_text(extent.labels, extent.sizes)}):\n{body}"
