"""danaus's settings, with Monarch's ``monarch.config`` shape.

Precedence: defaults < ``DANAUS_*`` environment variables < ``configure()``.
``docs/config.md`` lists every setting::

    from danaus.config import configure, configured, get_global_config

    configure(heartbeat_timeout="2s")
    with configured(codec_max_frame_length="1GiB"):
        ...
"""

from ._config import SETTINGS as SETTINGS
from ._config import Setting as Setting
from ._config import clear_runtime_config as clear_runtime_config
from ._config import configure as configure
from ._config import configured as configured
from ._config import get_global_config as get_global_config
from ._config import get_runtime_config as get_runtime_config

__all__ = [
    "SETTINGS",
    "Setting",
    "clear_runtime_config",
    "configure",
    "configured",
    "get_global_config",
    "get_runtime_config",
]

for _name in ("Setting",):
    globals()[_name].__module__ = __name__
