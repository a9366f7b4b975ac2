"""``danaus.tools.config.environment``: Monarch's environment descriptions.

danaus syncs directories, not environments (``docs/jobs.md``, code sync): an
``Environment`` given to a ``Workspace`` is kept as given and does not travel.
"""

from __future__ import annotations

import os

__all__ = ["ACTIVE_CONDA_ENV", "CondaEnvironment", "Environment", "NoCondaEnvironment"]


class Environment:
    """The dependencies of a workspace's projects (not synced by danaus)."""


class NoCondaEnvironment(RuntimeError, AssertionError):
    """No conda environment was given and none is active. An ``AssertionError`` too,
    since Monarch's ``CondaEnvironment`` asserts (programs may catch that)."""


class CondaEnvironment(Environment):
    """A conda environment: ``conda_prefix``, or the active one (``$CONDA_PREFIX``)."""

    def __init__(self, conda_prefix: str | None = None) -> None:
        self._conda_prefix = conda_prefix

    @property
    def conda_prefix(self) -> str:
        prefix = self._conda_prefix or os.environ.get("CONDA_PREFIX")
        if not prefix:
            raise NoCondaEnvironment(
                "No currently active conda environment. Either give conda_prefix or activate one."
            )
        return prefix

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CondaEnvironment) and self._conda_prefix == other._conda_prefix

    def __hash__(self) -> int:
        return hash(self._conda_prefix)


ACTIVE_CONDA_ENV = CondaEnvironment()
