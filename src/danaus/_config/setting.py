"""A setting's descriptor, and the size units the settings' defaults are written in."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Setting:
    """One setting: its name, kind (``bool``, ``int``, ``float``, ``str``,
    ``duration``, ``size``), default and documentation."""

    name: str
    kind: str
    default: Any
    doc: str
    default_doc: str = ""  # how the default is computed, when it depends on the machine

    @property
    def env(self) -> str:
        return "DANAUS_" + self.name.upper()


_GiB = 1 << 30
_MiB = 1 << 20


def _default_max_frame() -> int:
    """4 GiB, or a quarter of this machine's memory if that is less (at least 64 MiB)."""
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return 4 * _GiB
    return max(64 * _MiB, min(4 * _GiB, ram // 4))
