"""``danaus.builtins``: Monarch's ``monarch.builtins``, remote functions for common chores.

Call them under an active mesh (``with procs.activate():``); each runs on every
proc of the mesh. ``danaus.builtins.log`` has ``log_remote`` and
``set_logging_level_remote`` (re-exported here, as Monarch does);
``danaus.builtins.random`` seeds and saves torch's random number generators.
Needs torch (the ``torch`` extra).
"""

from __future__ import annotations

from .log import log_remote, set_logging_level_remote

__all__ = ["log_remote", "set_logging_level_remote"]
