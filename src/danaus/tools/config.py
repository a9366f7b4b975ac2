"""``danaus.tools.config``: Monarch's ``monarch.tools.config`` — the ``Workspace`` to sync.

Example::

    from danaus.tools.config import Workspace

    hosts.sync_workspace(Workspace(dirs=["./trainer"])).get()
"""

from __future__ import annotations

from .._actor.api.code_sync import Workspace

__all__ = ["Workspace"]

Workspace.__module__ = __name__
