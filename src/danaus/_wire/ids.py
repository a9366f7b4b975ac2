"""Identifiers of procs, actors and ports: small immutable tuples that travel in headers."""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["ActorId", "PortId", "ProcId"]


class ProcId(NamedTuple):
    """One OS process: a name unique within the client's job and the address it listens on."""

    name: str
    addr: str

    def __str__(self) -> str:
        return self.name


class ActorId(NamedTuple):
    """One actor: the proc it lives on, the name of its actor mesh and its rank in that mesh."""

    proc: ProcId
    mesh: str
    rank: int

    def __str__(self) -> str:
        return f"{self.proc.name}/{self.mesh}[{self.rank}]"

    # Monarch's ActorId (ActorAddr) names, as strings.
    @property
    def proc_id(self) -> str:
        """The proc, ``name@address`` (Monarch's ``proc@location``)."""
        return f"{self.proc.name}@{self.proc.addr}"

    @property
    def proc_name(self) -> str:
        """The proc's name."""
        return self.proc.name

    @property
    def actor_name(self) -> str:
        """The name of the actor's mesh."""
        return self.mesh

    @property
    def addr(self) -> str:
        """The address of the actor's proc."""
        return self.proc.addr


class PortId(NamedTuple):
    """A port: the proc that owns the receiver and the port's number there."""

    proc: ProcId
    port: int

    def __str__(self) -> str:
        return f"{self.proc.name}:{self.port}"
