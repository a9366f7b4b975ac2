"""Monarch's ``monarch.common.function``: how ``remote`` turns its target into a function.

``resolvers`` is the list ``remote`` consults in order (``danaus.function_resolvers``
is the same list); insert your own to accept new kinds of target.
"""

from __future__ import annotations

from .._tensor.function import (
    ResolvableFunction,
    ResolvableFunctionFromPath,
    resolvable_function,
    resolvers,
)

__all__ = [
    "ResolvableFunction",
    "ResolvableFunctionFromPath",
    "resolvable_function",
    "resolvers",
]
