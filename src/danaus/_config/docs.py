"""The Markdown tables of ``docs/config.md`` (``python -m danaus._config`` prints them)."""

from __future__ import annotations

from .monarch import MONARCH_OPTIONS
from .monarch.option import Encoding, MonarchOption
from .settings import SETTINGS


def _monarch_type_doc(opt: MonarchOption) -> str:
    text = {
        "duration": "duration string ('30s')",
        "opt_duration": "duration string or None",
        "nonzero": "int >= 1",
        "opt_nonzero": "int >= 1 or None",
        "level": "str (log level)",
        "encoding": "Encoding",
        "transport": "ChannelTransport or str",
        "port_range": "slice(start, stop)",
        "socket_addr": "str (host:port)",
    }.get(opt.kind, opt.kind)
    return f"{text}, {opt.unit}" if opt.unit else text


def monarch_markdown_table() -> str:
    """Monarch's option names as the second Markdown table in ``docs/config.md``."""
    rows = [
        "| Monarch option | type | Monarch's default | in danaus |",
        "|---|---|---|---|",
    ]
    for o in MONARCH_OPTIONS:
        default = repr(o.default)
        if o.default is None and o.kind not in ("opt_duration", "opt_nonzero"):
            default = "(no default)"
        if isinstance(o.default, Encoding):
            default = f"Encoding.{o.default.name}"
        does = f"alias of `{o.setting}`: {o.why}" if o.setting else f"no effect: {o.why}"
        rows.append(f"| `{o.name}` | {_monarch_type_doc(o)} | {default} | {does} |")
    return "\n".join(rows)


def markdown_table() -> str:
    """The settings as the Markdown table in ``docs/config.md``."""
    rows = [
        "| setting | environment variable | kind | default | meaning |",
        "|---|---|---|---|---|",
    ]
    for s in SETTINGS:
        default = s.default_doc or (repr(s.default) if s.default != "" else "(unset)")
        rows.append(f"| `{s.name}` | `{s.env}` | {s.kind} | {default} | {s.doc} |")
    return "\n".join(rows)
