"""What the public faces (``danaus.rdma``, ``danaus.supervisor``, ...) share."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def publish(namespace: dict[str, Any], names: Iterable[str]) -> None:
    """Show each of ``names`` as defined by the face whose ``globals()`` is ``namespace``.

    Sets their ``__module__`` to the face's name, so that ``repr``, ``help()`` and the
    reference name the public module a program imports, not the private one defining it.
    An object whose ``__module__`` cannot be set (a constant) keeps its own.
    """
    module = namespace["__name__"]
    for name in names:
        try:
            namespace[name].__module__ = module
        except (AttributeError, TypeError):
            pass
