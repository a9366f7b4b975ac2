"""The process's settings (one ``Config``) and the functions ``danaus.config`` exports."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from .store import Config

_config = Config()


# The effective value of a setting in this process: the process's ``Config.get`` itself
# (read on every message: one Python call, not a wrapper around it).
get = _config.get
# The same as attributes (``values.spin_wait``): what the per-message paths read, a plain
# attribute after the first read (see ``Values``).
values = _config.values


def configure(**kwargs: Any) -> None:
    """Set settings for this process (and the procs it spawns on this host from now on).

    Does not block. Raises `ValueError` for an unknown name (listing the
    valid ones) or a malformed duration or size, `TypeError` for a value
    of the wrong type; nothing is changed when it raises:

        danaus.config.configure(heartbeat_timeout="2s", codec_max_frame_length="1GiB")
    """
    _config.configure(**kwargs)


@contextlib.contextmanager
def configured(**kwargs: Any) -> Iterator[dict[str, Any]]:
    """Apply ``configure(**kwargs)`` inside a ``with`` block, then restore the previous
    values; yields the effective settings. Raises as [`configure()`][danaus.config.configure]."""
    saved = _config.runtime()
    _config.configure(**kwargs)
    try:
        yield _config.effective()
    finally:
        _config.restore(saved)


def get_global_config() -> dict[str, Any]:
    """Every setting's effective value (defaults < environment < configure), then each
    of Monarch's option names with its value as Monarch shows it (an alias converted
    from its danaus setting; see ``MONARCH_OPTIONS``)."""
    return _config.effective()


def get_runtime_config() -> dict[str, Any]:
    """Only the settings given to ``configure()`` in this process."""
    return _config.runtime()


def clear_runtime_config() -> None:
    """Forget every ``configure()`` value: environment and defaults apply again."""
    _config.restore({})


def env_for_children() -> dict[str, str]:
    """Environment variables carrying this process's ``configure()`` values to a child."""
    return _config.env_for_children()
