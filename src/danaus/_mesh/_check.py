"""Argument checks shared by the mesh layer: each raises at once, quoting the bad value.

Every helper here turns a misuse into a builtin exception whose message
quotes the offending value with ``!r``, says what is valid and, where a close
match exists, adds "Probably you meant ...".
"""

from __future__ import annotations

import difflib
import operator
from collections.abc import Iterable, Sequence
from typing import Any


def as_int(value: object, what: str) -> int:
    """Return ``value`` as an ``int``; raise TypeError unless it is an integer.

    Anything with ``__index__`` (``int``, ``numpy.int64``) is accepted; ``bool``
    is refused because ``True`` as a rank or size is almost always a mistake.
    """
    if isinstance(value, bool):
        raise TypeError(f"{what} must be an int, got the bool {value!r}")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(
            f"{what} must be an int, got {value!r} of type {type(value).__name__}"
        ) from None


def as_nonneg_int(value: object, what: str) -> int:
    """Return ``value`` as an ``int`` >= 0; TypeError if not an int, ValueError if negative."""
    n = as_int(value, what)
    if n < 0:
        raise ValueError(f"{what} must be >= 0, got {value!r}")
    return n


def as_int_list(values: object, what: str) -> tuple[int, ...]:
    """Return a sequence of non-negative ints as a tuple; TypeError/ValueError otherwise."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise TypeError(f"{what} must be a sequence of ints, got {values!r}")
    return tuple(as_nonneg_int(v, f"each of {what}") for v in values)


def as_tuple(values: object, must: str) -> tuple[Any, ...]:
    """Return ``values`` as a tuple; TypeError saying what it ``must`` be if not iterable."""
    if not isinstance(values, Iterable):
        raise TypeError(f"{must}, got {values!r}")
    return tuple(values)


def as_labels(labels: object, what: str = "labels") -> tuple[str, ...]:
    """Return a sequence of distinct dimension names as a tuple.

    Raises TypeError for a bare string or a non-string name, ValueError for a
    name given twice.
    """
    if isinstance(labels, str):
        raise TypeError(
            f"{what} must be a sequence of names, got the string {labels!r}. "
            f"Probably you meant [{labels!r}]"
        )
    out = as_tuple(labels, f"{what} must be a sequence of names")
    for label in out:
        if not isinstance(label, str):
            raise TypeError(f"each of {what} must be a str, got {label!r} in {list(out)!r}")
    check_unique(out, what)
    return out


def check_unique(names: Sequence[str], what: str) -> None:
    """Raise ValueError naming the first name that occurs twice in ``names``."""
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ValueError(f"Duplicate dimension name {name!r} in {what} {list(names)!r}")
        seen.add(name)


def did_you_mean(bad: str, valid: Iterable[str]) -> str:
    """Return " Probably you meant 'x'." for a close match of ``bad`` in ``valid``, else ""."""
    close = difflib.get_close_matches(bad, list(valid), n=1)
    return f" Probably you meant {close[0]!r}." if close else ""


def unknown_dim_message(bad: object, valid: Sequence[str]) -> str:
    """Say that ``bad`` is not one of the dimensions ``valid``, suggesting a close match."""
    hint = did_you_mean(bad, valid) if isinstance(bad, str) else ""
    return f"no dimension named {bad!r}; the dimensions are {list(valid)!r}.{hint}"
