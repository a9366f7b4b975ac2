"""Monarch's option names: the table (aliases of settings, then the options kept with
no effect) and how their values are checked and converted."""

from __future__ import annotations

from .aliases import ALIASES
from .kept import KEPT_OPTIONS
from .option import MonarchOption

#: Monarch's option names, in the order of docs/config.md's second table.
MONARCH_OPTIONS: tuple[MonarchOption, ...] = (*ALIASES, *KEPT_OPTIONS)

BY_NAME: dict[str, MonarchOption] = {o.name: o for o in MONARCH_OPTIONS}
#: The no-effect options (kept under their Monarch name); aliases map to a setting.
KEPT: dict[str, MonarchOption] = {o.name: o for o in MONARCH_OPTIONS if not o.setting}
