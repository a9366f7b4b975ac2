"""One of Monarch's option names (``MonarchOption``), its encodings and the warning
for an option with no effect."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

# -- Monarch's option names ---------------------------------------------------
#
# Every keyword argument Monarch's ``monarch.config.configure()`` accepts: the
# options its Rust attributes declare with a Python name
# (``@meta(CONFIG = ConfigAttr { py_name: Some(..) })``, read from
# meta-pytorch/monarch at 3fc0a66), plus the three ``remote_alloc_*`` options
# its typed signature still lists. An option danaus has the same knob for is an
# alias of that setting (both names read and write one value, converted where
# the units differ); any other is accepted, kept, returned by
# ``get_global_config()``, passed to spawned procs and reported once, when
# ``configure()`` first sets it, as having no effect.


class Encoding(enum.IntEnum):
    """Monarch's message payload encodings (``configure(default_encoding=...)``).

    danaus has one wire format of its own, so the choice is kept and reported,
    not used."""

    Bincode = 0
    Json = 1
    Multipart = 2

    def __str__(self) -> str:
        return f"Encoding.{self.name}"


class NoEffectWarning(UserWarning):
    """A Monarch option was configured that has no effect in danaus."""


@dataclass(frozen=True, slots=True)
class MonarchOption:
    """One of Monarch's option names: its type, its default as Monarch's
    ``get_global_config()`` shows it (``None``: no default, absent until set),
    its environment variable, and either the danaus setting it is an alias of
    or why it has no effect here."""

    name: str
    kind: str  # bool, int, nonzero, opt_nonzero, float, str, duration, opt_duration,
    # encoding, transport, port_range, socket_addr, level
    default: Any
    env: str
    setting: str = ""  # the danaus setting this name is an alias of
    why: str = ""  # no-effect options: why; aliases: how the value is converted
    unit: str = ""
    maximum: int | None = None


def _m(
    name: str,
    kind: str,
    default: Any,
    env: str,
    why: str,
    *,
    setting: str = "",
    unit: str = "",
    maximum: int | None = None,
) -> MonarchOption:
    return MonarchOption(name, kind, default, env, setting, why, unit, maximum)


_H, _HM, _MR = "HYPERACTOR_", "HYPERACTOR_MESH_", "MONARCH_RDMA_"
