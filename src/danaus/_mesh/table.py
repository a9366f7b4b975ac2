"""Render a Shape as a fixed-width text table: one row per rank, one column per dimension.

::

    index  rank  hosts  gpus
    -----  ----  -----  ----
        0     0      0     0
        1     1      0     1
"""

from __future__ import annotations

import itertools

from .shape import Shape

__all__ = ["render_table"]


def render_table(shape: Shape) -> str:
    """Return a table of ``shape``'s ranks: local index, global rank, then each coordinate.

    A 0-dimensional shape gives one row; an empty shape gives just the header.
    Never raises.
    """
    header = ["index", "rank", *shape.labels]
    ndslice = shape.ndslice
    rows = [
        [str(i), str(rank), *map(str, coords)]
        for i, (rank, coords) in enumerate(
            zip(ndslice, itertools.product(*(range(n) for n in ndslice.sizes)), strict=True)
        )
    ]
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]
    lines = [
        "  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True)),
        "  ".join("-" * w for w in widths),
    ]
    lines.extend("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in rows)
    return "\n".join(lines)
