"""Settings' values from text (the environment) and from ``configure()``: durations,
sizes, booleans, each checked against its setting's kind; and durations as Monarch
writes them."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from .setting import Setting

_UNITS = {
    "ns": 1e-9,
    "nsec": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "usec": 1e-6,
    "ms": 1e-3,
    "msec": 1e-3,
    "s": 1.0,
    "sec": 1.0,
    "secs": 1.0,
    "second": 1.0,
    "seconds": 1.0,
    "m": 60.0,
    "min": 60.0,
    "mins": 60.0,
    "minute": 60.0,
    "minutes": 60.0,
    "h": 3600.0,
    "hr": 3600.0,
    "hrs": 3600.0,
    "hour": 3600.0,
    "hours": 3600.0,
    "d": 86400.0,
    "day": 86400.0,
    "days": 86400.0,
    "w": 7 * 86400.0,
    "week": 7 * 86400.0,
    "weeks": 7 * 86400.0,
}
_SIZES = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kb": 1000,
    "kib": 1 << 10,
    "m": 1 << 20,
    "mb": 1000**2,
    "mib": 1 << 20,
    "g": 1 << 30,
    "gb": 1000**3,
    "gib": 1 << 30,
    "t": 1 << 40,
    "tb": 1000**4,
    "tib": 1 << 40,
}
_TERM = re.compile(r"\s*([0-9]*\.?[0-9]+)\s*([a-zµ]*)\s*", re.IGNORECASE)


def parse_duration(text: str) -> float:
    """Seconds in ``"1.5"``, ``"500ms"``, ``"1h 30m"``; `ValueError` otherwise."""
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    total, pos = 0.0, 0
    while pos < len(text):
        m = _TERM.match(text, pos)
        if m is None or m.end() == pos or m.group(2).lower() not in _UNITS:
            raise ValueError(
                f"{text!r} is not a duration; write seconds (1.5) or a number with one of "
                f"the units {', '.join(sorted(_UNITS))} ('500ms', '1h 30m')"
            )
        total += float(m.group(1)) * _UNITS[m.group(2).lower()]
        pos = m.end()
    if not text:
        raise ValueError("an empty string is not a duration")
    return total


def parse_size(text: str) -> int:
    """Bytes in ``"4096"``, ``"64MiB"``, ``"4 GiB"``; `ValueError` otherwise."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-z]*)\s*", text, re.IGNORECASE)
    if m is None or m.group(2).lower() not in _SIZES:
        raise ValueError(
            f"{text!r} is not a size; write bytes (4096) or a number with a unit "
            "('64MiB', '4GiB', '10GB')"
        )
    return int(float(m.group(1)) * _SIZES[m.group(2).lower()])


def _parse_bool(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"{text!r} is not a boolean; write 1/0, true/false, yes/no or on/off")


_FROM_TEXT: dict[str, Callable[[str], Any]] = {
    "bool": _parse_bool,
    "int": int,
    "float": float,
    "str": str,
    "duration": parse_duration,
    "size": parse_size,
}


def _coerce(setting: Setting, value: Any) -> Any:
    """A value given to ``configure()``, checked and converted to the setting's kind."""
    kind = setting.kind
    if kind == "bool":
        if isinstance(value, bool):
            return value
    elif kind == "int":
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif kind == "str":
        if isinstance(value, str):
            return value
    elif kind in ("float", "duration"):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if value < 0:
                raise ValueError(f"{setting.name} must not be negative (got {value!r})")
            return float(value)
        if kind == "duration" and isinstance(value, str):
            return parse_duration(value)
    elif kind == "size":
        if isinstance(value, int) and not isinstance(value, bool):
            if value < 0:
                raise ValueError(f"{setting.name} must not be negative (got {value!r})")
            return value
        if isinstance(value, str):
            return parse_size(value)
    expected = {
        "duration": "seconds (int or float) or a string such as '30s'",
        "size": "bytes (int) or a string such as '64MiB'",
        "float": "a number",
    }.get(kind, kind)
    raise TypeError(f"{setting.name} takes {expected}, not {type(value).__name__} ({value!r})")


def format_duration(seconds: float) -> str:
    """``seconds`` as Monarch writes a duration (humantime): ``"1m 30s"``, ``"500ms"``."""
    ns = round(seconds * 1e9)
    if ns == 0:
        return "0s"
    parts = []
    for unit, size in (
        ("d", 86400 * 10**9),
        ("h", 3600 * 10**9),
        ("m", 60 * 10**9),
        ("s", 10**9),
        ("ms", 10**6),
        ("us", 10**3),
        ("ns", 1),
    ):
        n, ns = divmod(ns, size)
        if n:
            parts.append(f"{n}{unit}")
    return " ".join(parts)
