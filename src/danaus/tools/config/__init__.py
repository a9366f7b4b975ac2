"""``danaus.tools.config``: Monarch's ``monarch.tools.config`` — ``Config`` for
``danaus.tools.commands.create`` and the ``Workspace`` to sync.

Example:

    from danaus.tools.config import Workspace

    hosts.sync_workspace(Workspace(dirs=["./trainer"])).get()
"""

from __future__ import annotations

from ..._actor.api.code_sync import Workspace
from ..._job.servers import NOT_SET as NOT_SET
from ..._job.servers import Config

__all__ = ["NOT_SET", "Config", "Workspace"]

Workspace.__module__ = __name__
Config.__module__ = __name__
