"""The mesh layer: the geometry of meshes, with no I/O.

Owns: ``Slice`` (alias ``NDSlice``, strided views of global ranks),
``Extent`` and ``Point`` (named sizes and named coordinates), ``Shape``
(labels over a Slice, cut with ``at``/``select``/``index``), ``Region``
(Monarch's name for the same), ``MeshTrait``
(``slice``, ``split``, ``rename``, ``flatten``, ``size``, ``sizes``,
``extent``, ``region``, ``to_table`` for any mesh that implements ``_shape`` and
``_new_with_shape``), ``ValueMesh`` (one value per rank) and ``Selection``
(Monarch's routing expressions over a slice's dimensions, ``"*, 0:4"``).

Imports: nothing else from danaus, and only the standard library. Pure:
every operation is a function of its arguments; misuse raises at once.

Modules: ``slice`` (Slice), ``shape`` (Extent, Point, Shape, Region: one module, as
each converts to the others), ``trait`` (MeshTrait), ``table`` (text rendering),
``value_mesh`` (ValueMesh), ``selection`` (Selection: its grammar, parser and
evaluation), ``_check`` (argument checks and error messages).
"""

from __future__ import annotations

from .selection import Selection
from .shape import Extent, Point, Region, Shape
from .slice import NDSlice, Slice
from .trait import MeshTrait
from .value_mesh import ValueMesh

__all__ = [
    "Extent",
    "MeshTrait",
    "NDSlice",
    "Point",
    "Region",
    "Selection",
    "Shape",
    "Slice",
    "ValueMesh",
]
