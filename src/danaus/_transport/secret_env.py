"""Keeping the job secret out of processes' environments (``/proc/PID/environ``).

``$DANAUS_SECRET`` is one way a user hands the secret to a client or a worker.
What danaus starts never gets it that way: a child's environment is built by
`environ_without_secret()`, and the secret goes on a pipe, stdin or a
private file instead. A process that did receive it (a worker the user started
with ``DANAUS_SECRET=... danaus worker``) calls `forget_environ_secret()`
once it holds the secret in memory, before it forks: removing the variable
from ``os.environ`` is not enough, since ``/proc/PID/environ`` shows the block
the process was *started* with (and a forked child inherits that block), so
the value is also overwritten there.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping

__all__ = ["SECRET_ENV", "environ_without_secret", "forget_environ_secret"]

SECRET_ENV = "DANAUS_SECRET"
_NEEDLE = (SECRET_ENV + "=").encode()


def environ_without_secret(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: ``os.environ``) as a dict without ``DANAUS_SECRET``: the
    environment of every process danaus starts."""
    env = os.environ if base is None else base
    return {k: v for k, v in env.items() if k != SECRET_ENV}


def forget_environ_secret() -> None:
    """Remove ``DANAUS_SECRET`` from this process's environment, including the block it
    was started with (what ``/proc/self/environ`` and children forked from now on show).

    The value's bytes in that block are overwritten with NULs, in place: the
    block's size and the other variables are unchanged. On a system without
    ``/proc`` only ``os.environ`` (and the C environment) is cleared.
    """
    os.environ.pop(SECRET_ENV, None)
    span = _environ_block()
    if span is None:
        return
    start, end = span
    block = ctypes.string_at(start, end - start)
    at = 0
    while (i := block.find(_NEEDLE, at)) >= 0:
        at = i + len(_NEEDLE)
        if i and block[i - 1] != 0:
            continue  # the text inside another variable's value, not a variable
        value_end = block.find(b"\0", at)
        if value_end < 0:
            value_end = len(block)
        ctypes.memset(start + at, 0, value_end - at)


def _environ_block() -> tuple[int, int] | None:
    """``(env_start, env_end)``, the addresses of this process's initial environment."""
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # Fields after the command name (which may hold spaces, in parentheses) start at
    # field 3; env_start and env_end are fields 50 and 51 (Linux 3.5 and later).
    fields = stat[stat.rfind(b")") + 2 :].split()
    try:
        start, end = int(fields[50 - 3]), int(fields[51 - 3])
    except (IndexError, ValueError):
        return None
    return (start, end) if 0 < start < end else None
