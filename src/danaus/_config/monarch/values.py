"""Values given under Monarch's option names: checked, in the form Monarch's
``get_global_config()`` shows them, converted to and from an alias's danaus setting and
to and from environment-variable text."""

from __future__ import annotations

import enum
from typing import Any

from ..parse import _parse_bool, format_duration, parse_duration
from .option import Encoding, MonarchOption

_LEVELS_IN = {"": "INFO", "trace": "DEBUG", "debug": "DEBUG", "info": "INFO",
              "warn": "WARNING", "warning": "WARNING", "error": "ERROR"}  # fmt: skip
_LEVELS_OUT = {"DEBUG": "debug", "INFO": "info", "WARNING": "warn", "WARN": "warn",
               "ERROR": "error", "CRITICAL": "error"}  # fmt: skip


def _monarch_type_error(opt: MonarchOption, value: Any) -> TypeError:
    expected = {
        "bool": "a bool",
        "int": "an int (>= 0)",
        "nonzero": "an int (>= 1)",
        "opt_nonzero": "an int (>= 1) or None",
        "float": "a float",
        "str": "a str",
        "level": "a str ('debug', 'info', 'warn' or 'error')",
        "duration": "a duration string such as '30s' or '1m 30s' (or seconds)",
        "opt_duration": "a duration string such as '30s' (or seconds), or None",
        "encoding": "an Encoding (Encoding.Bincode, Encoding.Json or Encoding.Multipart)",
        "transport": "a ChannelTransport or an address string",
        "port_range": "a slice(start, stop) of ports",
        "socket_addr": "a socket address string such as '[::]:1729'",
    }[opt.kind]
    return TypeError(
        f"Monarch option {opt.name} takes {expected}, not {type(value).__name__} ({value!r})"
    )


def _check_port(opt: MonarchOption, v: Any, what: str) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= 65535:
        raise TypeError(f"Monarch option {opt.name}: slice.{what} must be an int in [0, 65535]")
    return v


def _coerce_monarch(opt: MonarchOption, value: Any) -> Any:
    """A value given to ``configure()`` under a Monarch name, checked, in the form
    Monarch's ``get_global_config()`` returns it."""
    kind = opt.kind
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if kind in ("opt_duration", "opt_nonzero") and value is None:
        return None
    if kind == "bool" and isinstance(value, bool):
        return value
    if kind in ("int", "nonzero", "opt_nonzero") and is_int:
        low = 0 if kind == "int" else 1
        if value < low or (opt.maximum is not None and value > opt.maximum):
            top = f" and <= {opt.maximum}" if opt.maximum is not None else ""
            raise ValueError(f"Monarch option {opt.name} must be >= {low}{top} (got {value!r})")
        return value
    if kind == "float" and (isinstance(value, float) or is_int):
        return float(value)
    if kind == "str" and isinstance(value, str):
        return value
    if kind == "level" and isinstance(value, str):
        if value.strip().lower() not in _LEVELS_IN:
            raise ValueError(
                f"Monarch option {opt.name} is 'debug', 'info', 'warn' or 'error', not {value!r}"
            )
        return value.strip().lower()
    if kind in ("duration", "opt_duration"):
        if isinstance(value, str):
            return format_duration(parse_duration(value))
        if (is_int or isinstance(value, float)) and value >= 0:
            return format_duration(float(value))
    if kind == "encoding":
        if isinstance(value, Encoding):
            return value
        if isinstance(value, str) and value.capitalize() in Encoding.__members__:
            return Encoding[value.capitalize()]
    if kind == "transport":
        if isinstance(value, enum.Enum) and type(value).__name__ == "ChannelTransport":
            return str(value.value)
        if isinstance(value, str) and value:
            return value
    if kind == "socket_addr" and isinstance(value, str):
        host, sep, port = value.rpartition(":")
        if not sep or not host or not port.isdigit() or int(port) > 65535:
            raise ValueError(
                f"Monarch option {opt.name} is a socket address such as '[::]:1729', not {value!r}"
            )
        return value
    if kind == "port_range" and isinstance(value, slice):
        if value.step not in (None, 1):
            raise ValueError(f"Monarch option {opt.name}: port ranges take no step (got {value})")
        start = _check_port(opt, value.start, "start")
        stop = _check_port(opt, value.stop, "stop")
        if start > stop:
            raise ValueError(
                f"Monarch option {opt.name}: slice({start}, {stop}) starts after it stops"
            )
        return slice(start, stop)
    raise _monarch_type_error(opt, value)


def _alias_in(opt: MonarchOption, value: Any) -> Any:
    """A Monarch value of alias ``opt``, as its danaus setting's value."""
    checked = _coerce_monarch(opt, value)
    if opt.kind == "duration":
        return parse_duration(checked)
    if opt.kind == "level":
        return _LEVELS_IN[checked]
    return checked


def _alias_out(opt: MonarchOption, value: Any) -> Any:
    """The value of ``opt``'s danaus setting, as Monarch shows it."""
    if opt.kind == "duration":
        return format_duration(value)
    if opt.kind == "level":
        return _LEVELS_OUT.get(str(value).upper(), str(value).lower())
    return value


def _monarch_to_text(opt: MonarchOption, value: Any) -> str:
    """A kept Monarch value as its environment variable text (see ``_monarch_from_text``)."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Encoding):
        return value.name.lower()
    if isinstance(value, slice):
        return f"{value.start}..{value.stop}"
    return str(value)


def _monarch_from_text(opt: MonarchOption, text: str) -> Any:
    kind = opt.kind
    if kind in ("opt_duration", "opt_nonzero") and text.strip().lower() in ("", "none"):
        return None
    if kind == "bool":
        return _parse_bool(text)
    if kind in ("int", "nonzero", "opt_nonzero"):
        return _coerce_monarch(opt, int(text))
    if kind == "float":
        return float(text)
    if kind == "port_range":
        start, sep, stop = text.partition("..")
        if not sep:
            raise ValueError(f"{text!r} is not a port range; write START..STOP")
        return _coerce_monarch(opt, slice(int(start), int(stop)))
    if kind == "encoding" and text.strip().lower() == "serde_json":
        return Encoding.Json
    return _coerce_monarch(opt, text)
