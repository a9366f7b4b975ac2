"""Identifiers of procs, actors and ports: small immutable tuples that travel in headers."""

from __future__ import annotations

import re
import secrets
from typing import NamedTuple

__all__ = ["ActorId", "PortId", "ProcId", "Uid"]

# A label: what Monarch's labels allow (letters, digits, ``_``, ``-``, ``.``), not empty.
_LABEL = re.compile(r"[A-Za-z0-9_.\-]+")
_UID = re.compile(r"(?P<label>[A-Za-z0-9_.\-]*)<(?P<value>[0-9a-f]{1,16})>")


class Uid:
    """A unique identifier, Monarch's ``Uid``: a *singleton* named by its label, or an
    *instance*, a random 64-bit value with an optional display label.

    A singleton's label is its identity; an instance's label is only for display and
    takes no part in equality or hashing. Written ``label`` (singleton), ``label<hex>``
    or ``<hex>`` (instances); Monarch writes the value in base58, danaus in hex.
    """

    __slots__ = ("_label", "_value")

    def __init__(self, label: str | None, value: int | None) -> None:
        if label is not None and not _LABEL.fullmatch(label):
            raise ValueError(f"invalid uid label {label!r}: use letters, digits, '_', '-' and '.'")
        if value is None and label is None:
            raise ValueError("a singleton Uid needs a label")
        self._label = label
        self._value = value

    @staticmethod
    def anonymous() -> Uid:
        """A fresh instance uid without a label."""
        return Uid(None, secrets.randbits(64))

    @staticmethod
    def instance(label: str | None = None) -> Uid:
        """A fresh instance uid with an optional display label."""
        return Uid(label, secrets.randbits(64))

    @staticmethod
    def singleton(label: str) -> Uid:
        """The singleton uid named ``label``."""
        return Uid(label, None)

    @staticmethod
    def from_string(uid: str) -> Uid:
        """Parse ``label``, ``label<hex>`` or ``<hex>``; ``ValueError`` for anything else."""
        if not isinstance(uid, str):
            raise TypeError(f"Uid.from_string needs a str, got {uid!r}")
        m = _UID.fullmatch(uid)
        if m:
            return Uid(m["label"] or None, int(m["value"], 16))
        if _LABEL.fullmatch(uid):
            return Uid(uid, None)
        raise ValueError(
            f"invalid uid {uid!r}: write 'label' (singleton), 'label<hex>' or '<hex>' (instance)"
        )

    @property
    def label(self) -> str | None:
        return self._label

    @property
    def is_instance(self) -> bool:
        return self._value is not None

    @property
    def is_singleton(self) -> bool:
        return self._value is None

    def __str__(self) -> str:
        if self._value is None:
            return str(self._label)
        return f"{self._label or ''}<{self._value:x}>"

    def __repr__(self) -> str:
        return f"Uid({self})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Uid):
            return NotImplemented
        if self._value is None or other._value is None:
            return self._value is other._value and self._label == other._label
        return self._value == other._value

    def __hash__(self) -> int:
        return hash(("s", self._label) if self._value is None else ("i", self._value))

    def __reduce__(self) -> tuple[type[Uid], tuple[str | None, int | None]]:
        return (Uid, (self._label, self._value))


class ProcId(NamedTuple):
    """One OS process: a name unique within the client's job and the address it listens on."""

    name: str
    addr: str

    def __str__(self) -> str:
        return self.name

    # Monarch's ProcId names. A danaus proc is identified by its name within the job
    # (its address says where it listens), so its uid is the singleton of that name.
    @property
    def uid(self) -> Uid:
        """The proc's identity as a [`Uid`][danaus.actor.Uid]: the singleton named by the proc's
        name."""
        return Uid.singleton(self.name)

    @property
    def label(self) -> str:
        """The proc's name."""
        return self.name

    @staticmethod
    def from_string(proc_id: str) -> ProcId:
        """Parse ``name@address``: ``Instance.proc_id``'s form (Monarch's ``proc@location``)."""
        if not isinstance(proc_id, str):
            raise TypeError(f"ProcId.from_string needs a str, got {proc_id!r}")
        name, sep, addr = proc_id.partition("@")
        if not sep or not name or not addr:
            raise ValueError(f"invalid proc id {proc_id!r}: write it 'name@address'")
        return ProcId(name, addr)


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
