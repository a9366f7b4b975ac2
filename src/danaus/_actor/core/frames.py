"""Which frames of a traceback are danaus's own, and the user's part of a remote one.

A frame is danaus's when its file lies under the directory of the ``danaus``
package, wherever in it: modules may move between subpackages without the
filter going stale (it once compared against one file's name, and a move let
the dispatch frame back into every remote traceback).
"""

from __future__ import annotations

import functools
import os
import sys
from types import TracebackType

__all__ = ["is_internal_file", "user_traceback"]

# The directories of the top-level package (one, unless it is a namespace package),
# taken from the package itself rather than from this file's place in it.
_PACKAGE_DIRS = tuple(
    os.path.join(os.path.realpath(d), "")
    for d in getattr(sys.modules[__name__.partition(".")[0]], "__path__", ())
)


@functools.lru_cache(maxsize=1024)
def is_internal_file(filename: str) -> bool:
    """Whether ``filename`` (a code object's ``co_filename``) is a module of danaus."""
    return os.path.realpath(filename).startswith(_PACKAGE_DIRS)


def user_traceback(tb: TracebackType | None) -> TracebackType | None:
    """``tb`` without danaus's frames at its top: the dispatch that ran the user's code.

    An endpoint's exception travels up through the frames that received the
    message and called the endpoint (or ``__init__``); the user's frames start
    below them. A traceback of danaus's frames only (an internal error, a bug
    to report) is returned whole.
    """
    user = tb
    while user is not None and is_internal_file(user.tb_frame.f_code.co_filename):
        user = user.tb_next
    return tb if user is None else user
