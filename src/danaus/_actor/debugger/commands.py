"""Parse the debugger's prompt commands (``list``, ``attach``, ``cast`` ...): pure, no I/O.

The syntax is Monarch's (``monarch debug``)::

    list | l                         sessions by actor, rank, coordinates, file and line
    attach | a <actor> <rank>        a full pdb session with one rank ('detach' leaves it)
    cast <actor> ranks(SEL) <cmd>    send one pdb command to several ranks
    continue | c                     clear breakpoints and continue every session
    detach                           (inside 'attach' only) back to this prompt
    help | h                         the list of commands
    quit | q                         leave the debugger; sessions stay paused

``SEL`` is one rank (``ranks(3)``), a list (``ranks(1,2)``), a range like a
Python slice (``ranks(0:8:2)``, ``ranks(:4)``) or coordinates
(``ranks(hosts=0, gpus=1:3)``, ``ranks(gpus=(0,2))``).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "Attach",
    "Cast",
    "Command",
    "CommandError",
    "Continue",
    "Detach",
    "Help",
    "ListSessions",
    "Quit",
    "RankSelection",
    "Selector",
    "parse",
    "select",
]

HELP = """\
commands:
  list | l                        list the paused sessions (actor, rank, coordinates, where)
  attach | a <actor> <rank>       attach to one session: a full pdb prompt
                                  ('detach' returns here; the session stays paused)
  cast <actor> ranks(SEL) <cmd>   send one pdb command to several sessions of <actor>;
                                  SEL: 3 | 1,4,6 | start:stop:step | dim=1:3, dim2=(0,2), dim3=4
  continue | c                    clear breakpoints and continue every session
  help | h                        this message
  quit | q                        leave the debugger; the sessions stay paused
<actor> is the name given to spawn() (or the mesh's id when two meshes share a name).
"""

# One rank, an explicit list, or a range; a mapping selects by coordinates.
Selector = int | tuple[int, ...] | range
RankSelection = Selector | Mapping[str, Selector]


class CommandError(ValueError):
    """A debugger command could not be parsed; the message says what to type instead."""


@dataclass(frozen=True)
class ListSessions:
    pass


@dataclass(frozen=True)
class Attach:
    actor: str
    rank: int


@dataclass(frozen=True)
class Cast:
    actor: str
    ranks: RankSelection
    command: str


@dataclass(frozen=True)
class Continue:
    pass


@dataclass(frozen=True)
class Detach:
    pass


@dataclass(frozen=True)
class Help:
    pass


@dataclass(frozen=True)
class Quit:
    pass


Command = ListSessions | Attach | Cast | Continue | Detach | Help | Quit

_SIMPLE: dict[str, Command] = {
    "l": ListSessions(),
    "list": ListSessions(),
    "c": Continue(),
    "continue": Continue(),
    "detach": Detach(),
    "h": Help(),
    "help": Help(),
    "?": Help(),
    "q": Quit(),
    "quit": Quit(),
    "exit": Quit(),
}
_NAMES = "list, attach, cast, continue, help, quit"
_INT = re.compile(r"-?\d+")
_DIM = re.compile(r"\s*([A-Za-z_]\w*)\s*=\s*")


def parse(line: str) -> Command | None:
    """The command typed on ``line``; ``None`` for a blank line.

    Raises `CommandError` naming what was wrong and the valid form.
    """
    text = line.strip()
    if not text:
        return None
    word, _, rest = text.partition(" ")
    rest = rest.strip()
    if word in _SIMPLE:
        if rest:
            raise CommandError(f"{word!r} takes no arguments, got {rest!r}")
        return _SIMPLE[word]
    if word in ("a", "attach"):
        parts = rest.split()
        if len(parts) != 2 or not _INT.fullmatch(parts[1]):
            raise CommandError(
                f"usage: attach <actor> <rank>, e.g. 'attach trainer 0' (got {text!r})"
            )
        return Attach(parts[0], int(parts[1]))
    if word == "cast":
        return _parse_cast(rest, text)
    raise CommandError(f"unknown command {word!r}; commands: {_NAMES} ('help' explains them)")


def _parse_cast(rest: str, text: str) -> Cast:
    usage = "usage: cast <actor> ranks(SEL) <pdb command>, e.g. 'cast trainer ranks(0:4) n'"
    actor, _, rest = rest.partition(" ")
    rest = rest.lstrip()
    if not actor or not rest.startswith("ranks("):
        raise CommandError(f"{usage} (got {text!r})")
    # a coordinate list ``dim=(0,2)`` holds parentheses of its own
    depth, close = 0, -1
    for i, ch in enumerate(rest[len("ranks(") :], start=len("ranks(")):
        if ch == "(":
            depth += 1
        elif ch == ")":
            if depth == 0:
                close = i
                break
            depth -= 1
    if close < 0:
        raise CommandError(f"unclosed 'ranks(' in {text!r}; {usage}")
    ranks = parse_ranks(rest[len("ranks(") : close])
    command = rest[close + 1 :].strip()
    if not command:
        raise CommandError(f"no pdb command after ranks(...) in {text!r}; {usage}")
    return Cast(actor, ranks, command)


def parse_ranks(sel: str) -> RankSelection:
    """The selection inside ``ranks(...)``: ``3``, ``1,2``, ``0:8:2`` or ``dim=..., ...``."""
    sel = sel.strip()
    if not sel:
        raise CommandError(
            "ranks() is empty; give a rank (3), a list (1,2), a range (0:8:2) or dim=i"
        )
    if _DIM.match(sel):
        dims: dict[str, Selector] = {}
        for name, value in _split_dims(sel):
            if name in dims:
                raise CommandError(f"dimension {name!r} is given twice in ranks({sel})")
            dims[name] = _selector(value.strip("() "), f"{name}={value}")
        return dims
    return _selector(sel, sel)


def _split_dims(sel: str) -> list[tuple[str, str]]:
    """``"a=1, b=(0,2)"`` -> ``[("a", "1"), ("b", "(0,2)")]``."""
    out: list[tuple[str, str]] = []
    pos = 0
    while pos < len(sel):
        m = _DIM.match(sel, pos)
        if m is None:
            raise CommandError(f"expected 'dim=value' at {sel[pos:]!r} in ranks({sel})")
        start = m.end()
        depth, end = 0, len(sel)
        for i in range(start, len(sel)):
            if sel[i] == "(":
                depth += 1
            elif sel[i] == ")":
                depth -= 1
            elif sel[i] == "," and depth == 0:
                end = i
                break
        value = sel[start:end].strip()
        if not value:
            raise CommandError(f"dimension {m.group(1)!r} has no value in ranks({sel})")
        out.append((m.group(1), value))
        pos = end + 1
    return out


def _selector(text: str, shown: str) -> Selector:
    text = text.strip()
    try:
        if ":" in text:
            parts = [p.strip() for p in text.split(":")]
            if len(parts) > 3:
                raise ValueError
            start = int(parts[0]) if parts[0] else 0
            stop = int(parts[1]) if parts[1] else sys.maxsize
            step = int(parts[2]) if len(parts) == 3 and parts[2] else 1
            if step == 0:
                raise CommandError(f"the step of {shown!r} is 0; use a positive step")
            return range(start, stop, step)
        if "," in text:
            return tuple(int(p) for p in text.split(","))
        return int(text)
    except CommandError:
        raise
    except ValueError:
        raise CommandError(
            f"cannot read {shown!r} as ranks: use a rank (3), a list (1,2), a range "
            "(start:stop:step) or dim=value"
        ) from None


def _matches(value: int, sel: Selector) -> bool:
    if isinstance(sel, int):
        return value == sel
    return value in sel


def select(rank: int, coords: Mapping[str, int], sel: RankSelection) -> bool:
    """Whether the session at ``rank`` with ``coords`` is in the selection ``sel``."""
    if isinstance(sel, Mapping):
        return all(dim in coords and _matches(coords[dim], s) for dim, s in sel.items())
    return _matches(rank, sel)
