"""Every setting of danaus, in one table: defaults < environment < ``configure()``.

A setting has a name, a type, a default, an environment variable
(``DANAUS_`` + the name in capitals) and one line of documentation. Its value
is the last of these that is set:

1. the default in [`SETTINGS`][danaus.config.SETTINGS];
2. the environment variable, read when the setting is first needed;
3. ``configure(**kw)`` (or the ``configured(**kw)`` context manager) in this
   process.

Durations are seconds, given as a number or as a string with units
(``"500ms"``, ``"30s"``, ``"5m"``, ``"1h 30m"``); sizes are bytes, given as a
number or with a binary unit (``"64MiB"``, ``"4GiB"``). An unknown name is a
`ValueError` that lists the valid ones; a value of the wrong type is a
`TypeError`; a malformed environment variable is a `ValueError`
naming the variable.

This package is below every layer (it imports nothing of danaus but
``_errors``), so any layer may read settings with `get()`. The process's
settings are one `Config` object; the client hands the settings it has
configured to the host agent it starts (as environment variables), so procs
spawned on this host see them too. Workers on other hosts read their own
environment.

Secrets are not settings: ``DANAUS_SECRET`` is read only by the
authentication code, so that ``get_global_config()`` can be printed safely.
"""

from __future__ import annotations

from .docs import markdown_table as markdown_table
from .docs import monarch_markdown_table as monarch_markdown_table
from .monarch import BY_NAME as _monarch_by_name
from .monarch import KEPT as _kept
from .monarch import MONARCH_OPTIONS
from .monarch.option import Encoding, MonarchOption, NoEffectWarning
from .parametrize import parametrize_config, parametrize_config_pointwise
from .parse import format_duration as format_duration
from .parse import parse_duration as parse_duration
from .parse import parse_size as parse_size
from .process import _config as _config
from .process import (
    clear_runtime_config,
    configure,
    configured,
    env_for_children,
    get,
    get_global_config,
    get_runtime_config,
)
from .process import values as values
from .setting import Setting
from .setting import _default_max_frame as _default_max_frame
from .settings import BY_NAME as _settings_by_name
from .settings import SETTINGS
from .store import Config

# The names imported ``as`` themselves, and these, are not in __all__: they are for
# danaus's own code, tests and tools (``python -m danaus._config``).
_MONARCH = _monarch_by_name  # Monarch's option names, by name
_KEPT = _kept  # the no-effect ones, by name
_BY_NAME = _settings_by_name  # the settings, by name

__all__ = [
    "MONARCH_OPTIONS",
    "SETTINGS",
    "Config",
    "Encoding",
    "MonarchOption",
    "NoEffectWarning",
    "Setting",
    "clear_runtime_config",
    "configure",
    "configured",
    "env_for_children",
    "get",
    "get_global_config",
    "get_runtime_config",
    "parametrize_config",
    "parametrize_config_pointwise",
]
