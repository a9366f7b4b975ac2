"""Monarch's ``monarch.builtins.log``: logging on every proc of the active mesh.

``log_remote(msg, *args, level=logging.WARNING)`` logs with the logger
``log_remote`` on each proc; its records reach that proc's log (its output,
forwarded to the client at the level ``logging_option`` sets).
"""

from __future__ import annotations

from .._tensor.builtins import log_remote, set_logging_level_remote

__all__ = ["log_remote", "set_logging_level_remote"]
