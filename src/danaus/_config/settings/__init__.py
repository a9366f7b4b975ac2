"""Every setting, in the order of ``docs/config.md``'s table: one module a group."""

from __future__ import annotations

from ..setting import Setting
from .code_sync import CODE_SYNC
from .connections import CONNECTIONS
from .data_plane import DATA_PLANE
from .debugging import DEBUGGING
from .failure import FAILURE
from .logs import LOGS
from .messages import MESSAGES
from .observing import OBSERVING
from .stopping import STOPPING

#: The table of every setting. ``docs/config.md`` is generated from the same
#: rows (``python -m danaus._config`` prints it) and a test keeps the two equal.
SETTINGS: tuple[Setting, ...] = (
    *FAILURE,
    *MESSAGES,
    *CONNECTIONS,
    *CODE_SYNC,
    *STOPPING,
    *LOGS,
    *DATA_PLANE,
    *OBSERVING,
    *DEBUGGING,
)

BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}
