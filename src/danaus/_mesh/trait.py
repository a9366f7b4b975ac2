"""MeshTrait: slice, split, rename and flatten any mesh that can report and adopt a Shape.

A mesh class (ValueMesh here; host, proc and actor meshes elsewhere)
implements two members and inherits the rest:

    @property
    def _shape(self) -> Shape: ...                     # the mesh's labelled global ranks
    def _new_with_shape(self, shape: Shape) -> Self: ...  # the same mesh, cut to ``shape``

MeshTrait only ever passes ``_new_with_shape`` a shape whose ranks are a
subset of ``self._shape.ranks()`` (same ranks, same order for split, rename
and flatten). Shapes keep global offsets and strides, so slices of slices
compose on global ranks with no extra work.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import SupportsIndex, TypeVar

from ._check import as_int, as_labels, check_unique, did_you_mean, unknown_dim_message
from .shape import Extent, Region, Shape
from .slice import Slice, row_major_strides
from .table import render_table

__all__ = ["MeshTrait"]

_M = TypeVar("_M", bound="MeshTrait")
_PySlice = slice


class MeshTrait(ABC):
    """Mixin giving a mesh its named-dimension operations, built on ``_shape``."""

    __slots__ = ()

    @property
    @abstractmethod
    def _shape(self) -> Shape:
        """The labelled global ranks this mesh spans."""

    @abstractmethod
    def _new_with_shape(self: _M, shape: Shape) -> _M:
        """Return a mesh like this one over ``shape``, a subset of ``self._shape``'s ranks."""

    @property
    def _labels(self) -> tuple[str, ...]:
        """The dimension names, in order (Monarch's ``MeshTrait._labels``; programs
        such as Monarch's ``spmd_ddp`` example read it)."""
        return tuple(self._shape.labels)

    @property
    def _ndslice(self) -> Slice:
        """The global ranks as a strided slice (Monarch's ``MeshTrait._ndslice``)."""
        return self._shape.ndslice

    # -- cutting ------------------------------------------------------------

    def slice(self: _M, **dims: SupportsIndex | _PySlice) -> _M:
        """Return the sub-mesh selected by ``dims``; an int removes a dim, a slice keeps it.

        ``mesh.slice(hosts=0, gpus=slice(0, 4, 2))``. Raises TypeError for an
        unknown dim or a selector that is neither int nor slice, IndexError for
        an int outside ``0..size-1``, ValueError for a slice step <= 0 or a
        slice that selects nothing (``slice(5, 9)`` of a dim of size 4, or
        ``slice(2, 2)``), as Monarch raises.
        """
        shape = self._shape
        for label, selector in dims.items():
            if label not in shape.labels:
                raise TypeError(unknown_dim_message(label, shape.labels))
            if isinstance(selector, _PySlice):
                size = shape.extent[label]
                shape = shape.select(label, selector)
                if size and not shape.extent[label]:
                    raise ValueError(
                        f"slice({label}={selector!r}) selects no rank of dimension {label!r} "
                        f"(size {size}, indices 0..{size - 1}); give a range that overlaps it"
                    )
            elif isinstance(selector, bool) or not hasattr(type(selector), "__index__"):
                raise TypeError(
                    f"slice({label}={selector!r}): expected an int (which removes the "
                    f"dimension) or a slice such as slice(0, 2) (which keeps it)"
                )
            else:
                shape = shape.at(label, selector)
        return self._new_with_shape(shape)

    def split(self: _M, **kwargs: object) -> _M:
        """Return this mesh with some dims factored, row-major, into several new dims.

        ``mesh.split(hosts=("dp", "pp"), pp=4)``: a dim given a tuple of names
        is replaced by those dims; a new name given an int fixes its size; one
        size per tuple may be left out and is inferred. Raises TypeError for an
        unknown dim or a badly typed argument, ValueError when the sizes do not
        divide the dim, a size is not for any new name, or names repeat.
        """
        shape = self._shape
        labels = shape.labels
        groups, constraints = _parse_split(labels, kwargs)
        new_names = [name for label in labels for name in groups.get(label, (label,))]
        check_unique(new_names, "the split result")
        unused = set(constraints) - {n for group in groups.values() for n in group}
        if unused:
            bad = sorted(unused)[0]
            raise ValueError(
                f"unused size constraints: split got a size for {bad!r}, which is not one "
                f"of the new names "
                f"{[n for g in groups.values() for n in g]!r}; every size must belong to a "
                f"name in a tuple.{did_you_mean(bad, new_names)}"
            )
        ndslice = shape.ndslice
        sizes: list[int] = []
        strides: list[int] = []
        for label, size, stride in zip(labels, ndslice.sizes, ndslice.strides, strict=True):
            group = groups.get(label, (label,))
            group_sizes = (
                _group_sizes(label, size, group, constraints) if label in groups else [size]
            )
            sizes.extend(group_sizes)
            strides.extend(s * stride for s in row_major_strides(group_sizes))
        return self._new_with_shape(Shape(new_names, Slice(ndslice.offset, sizes, strides)))

    def rename(self: _M, **kwargs: str) -> _M:
        """Return this mesh with dims renamed, ``mesh.rename(hosts="dp")``; others are kept.

        Raises TypeError for an unknown dim or a non-string new name,
        ValueError when two dims would end up with the same name.
        """
        labels = self._shape.labels
        for old, new in kwargs.items():
            if old not in labels:
                raise TypeError(unknown_dim_message(old, labels))
            if not isinstance(new, str):
                hint = " Probably you meant split()." if isinstance(new, (tuple, list)) else ""
                raise TypeError(f"rename({old}={new!r}): the new name must be a str.{hint}")
        return self.split(**{old: (new,) for old, new in kwargs.items()})

    def flatten(self: _M, name: str) -> _M:
        """Return this mesh as one dim ``name`` holding all ranks in the same order.

        Raises TypeError for a non-string name, ValueError("cannot flatten
        sparse mesh ...") unless the ranks are consecutive in row-major order
        (dims of size 1 may have any stride).
        """
        if not isinstance(name, str):
            raise TypeError(f"flatten needs a str name for the new dimension, got {name!r}")
        ndslice = self._shape.ndslice
        dense = row_major_strides(ndslice.sizes)
        sparse = len(ndslice) > 0 and any(
            n > 1 and s != want
            for n, s, want in zip(ndslice.sizes, ndslice.strides, dense, strict=True)
        )
        if sparse:
            raise ValueError(
                f"cannot flatten sparse mesh: strides {list(ndslice.strides)!r} are not the "
                f"row-major strides {list(dense)!r} for sizes {list(ndslice.sizes)!r}, so its "
                f"ranks are not consecutive. Use split() or rename() instead, which keep any layout"
            )
        return self._new_with_shape(Shape([name], Slice(ndslice.offset, [len(ndslice)], [1])))

    # -- sizes --------------------------------------------------------------

    def size(self, dim: str | Iterable[str] | None = None) -> int:
        """Return the number of ranks along ``dim`` (a name or several names; None = all).

        Raises KeyError naming the valid dims for an unknown one, ValueError
        for a dim listed twice, TypeError for a non-string dim.
        """
        extent = self._shape.extent
        if dim is None:
            return extent.nelements
        if isinstance(dim, str):
            if dim not in extent:
                raise KeyError(unknown_dim_message(dim, extent.labels))
            return extent[dim]
        if not isinstance(dim, Iterable):
            raise TypeError(f"size() takes a dim name or a sequence of names, got {dim!r}")
        dims = as_labels(dim, "size() dims")
        return math.prod(self.size(d) for d in dims)

    @property
    def sizes(self) -> dict[str, int]:
        """The size of each dim, by name, outermost first."""
        return dict(self._shape.extent)

    @property
    def extent(self) -> Extent:
        """The dims and their sizes as an Extent."""
        return self._shape.extent

    @property
    def region(self) -> Region:
        """The mesh's labels over the base ranks it holds (Monarch's ``Region``)."""
        return self._shape.region

    def __len__(self) -> int:
        """The number of ranks in the mesh."""
        return len(self._shape)

    def to_table(self) -> str:
        """Return a text table with one row per rank: local index, global rank, coordinates."""
        return render_table(self._shape)


def _parse_split(
    labels: list[str], kwargs: dict[str, object]
) -> tuple[dict[str, tuple[str, ...]], dict[str, int]]:
    """Sort split's kwargs into {existing dim: new names} and {new name: size}."""
    groups: dict[str, tuple[str, ...]] = {}
    constraints: dict[str, int] = {}
    for key, value in kwargs.items():
        if key in labels:
            if not isinstance(value, (tuple, list)):
                hint = f" Probably you meant {key}=({value!r},)." if isinstance(value, str) else ""
                raise TypeError(
                    f"split({key}={value!r}): {key!r} is an existing dimension, so give the "
                    f"tuple of new names it splits into, e.g. {key}=('a', 'b').{hint}"
                )
            groups[key] = as_labels(value, f"the new names for {key!r}")
        elif isinstance(value, (tuple, list)):
            raise TypeError(
                f"split({key}={value!r}): cannot split: {unknown_dim_message(key, labels)}"
            )
        else:
            n = as_int(value, f"split size of new dimension {key!r} (not an existing dim)")
            if n < 1:
                raise ValueError(f"split size of new dimension {key!r} must be >= 1, got {n!r}")
            constraints[key] = n
    return groups, constraints


def _group_sizes(
    label: str, size: int, group: tuple[str, ...], constraints: dict[str, int]
) -> list[int]:
    """Return the sizes of ``group`` (one may be inferred); ValueError unless they make ``size``."""
    unknown = [n for n in group if n not in constraints]
    if len(unknown) > 1:
        raise ValueError(
            f"Cannot infer size of {list(group)!r}: cannot infer the sizes of {unknown!r} "
            f"when splitting {label!r} (size {size}); give all but one, e.g. {unknown[0]}=N"
        )
    known = math.prod(constraints[n] for n in group if n in constraints)
    inferred, remainder = divmod(size, known)
    if (unknown and remainder) or (not unknown and known != size):
        given = {n: constraints.get(n, "?") for n in group}
        raise ValueError(
            f"Dimension {label!r} of size {size} is not evenly divided by {list(group)!r} "
            f"with sizes {given!r}: the product must equal {size}"
        )
    return [constraints.get(n, inferred) for n in group]
