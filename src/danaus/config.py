"""danaus's settings, with Monarch's ``monarch.config`` shape.

Precedence: defaults < ``DANAUS_*`` environment variables < ``configure()``.
``configure()`` also takes every one of Monarch's option names: an alias of the
danaus setting with the same meaning, or kept (and returned by
``get_global_config()``) with a one-time warning that it has no effect here
(a ``NoEffectWarning``, also what other Monarch names without effect warn with).
``docs/config.md`` lists every setting and every Monarch name:

    from danaus.config import configure, configured, get_global_config

    configure(heartbeat_timeout="2s")
    with configured(codec_max_frame_length="1GiB"):
        ...
"""

from ._config import SETTINGS as SETTINGS
from ._config import Encoding as Encoding
from ._config import NoEffectWarning as NoEffectWarning
from ._config import Setting as Setting
from ._config import clear_runtime_config as clear_runtime_config
from ._config import configure as configure
from ._config import configured as configured
from ._config import get_global_config as get_global_config
from ._config import get_runtime_config as get_runtime_config
from ._config import parametrize_config as parametrize_config
from ._config import parametrize_config_pointwise as parametrize_config_pointwise

__all__ = [
    "SETTINGS",
    "Encoding",
    "NoEffectWarning",
    "Setting",
    "clear_runtime_config",
    "configure",
    "configured",
    "get_global_config",
    "get_runtime_config",
    "parametrize_config",
    "parametrize_config_pointwise",
]

for _name in ("Encoding", "Setting"):
    globals()[_name].__module__ = __name__
