"""Borrows as Monarch's controller reports them (``monarch/common/borrows.py``): a
borrow is ``BorrowCreate``, ``BorrowFirstUse`` (the borrowed tensor's first use),
``BorrowLastUse`` (its last tensor deleted, or the drop), ``BorrowDrop``. The tracer
follows which of the client's tensors each live borrow names and sends the two ``Use``
messages into the controller's trace at the points Monarch would."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class BorrowTrace:
    """A live borrow, for the controller's trace: ``names`` are the client's tensors in
    the borrowed storage (the borrowed tensor and the views made from it)."""

    alias: int
    storage: Any  # the borrowed tensor's danaus Storage, which its views share
    names: set[int] = field(default_factory=set)
    used: bool = False  # BorrowFirstUse sent
    last: bool = False  # BorrowLastUse sent


class BorrowTracer:
    """The live borrows; ``next_command`` names the controller's next message."""

    def __init__(self, next_command: Callable[[str | None], object]) -> None:
        self._next_command = next_command
        self._borrows: dict[int, BorrowTrace] = {}  # borrowed tensor's id -> its borrow
        self._borrowed: dict[int, BorrowTrace] = {}  # id(borrowed Storage) -> its borrow
        self._name_borrow: dict[int, BorrowTrace] = {}  # id -> the live borrow it names
        self._ended: set[int] = set()  # ids a borrow's drop deleted (their release: no message)

    def created(self, alias: int, storage: Any) -> None:
        """``BorrowCreate`` made ``alias``, a borrowed tensor in ``storage``."""
        b = BorrowTrace(alias, storage, {alias})
        self._borrows[alias] = b
        self._name_borrow[alias] = b
        if storage is not None:
            self._borrowed[id(storage)] = b

    def view_made(self, storage: Any, ref: int) -> None:
        """A new tensor ``ref`` in ``storage``: a view of a borrowed tensor is the
        borrow's until it goes."""
        if storage is None:
            return
        b = self._borrowed.get(id(storage))
        if b is not None:
            b.names.add(ref)
            self._name_borrow[ref] = b

    def first_use(self, refs: Iterable[int]) -> None:
        """``BorrowFirstUse`` before the first command that uses a borrowed tensor."""
        for r in refs:
            b = self._borrows.get(r)
            if b is not None and not b.used:
                b.used = True
                self._next_command("BorrowFirstUse")

    def last_use(self, b: BorrowTrace) -> None:
        if not b.used:  # Monarch marks a borrow used when its last tensor goes unused
            b.used = True
            self._next_command("BorrowFirstUse")
        b.last = True
        self._next_command("BorrowLastUse")

    def ended(self, ref: int) -> bool:
        """Whether a borrow's drop deleted ``ref`` already (its release sends nothing)."""
        if ref in self._ended:
            self._ended.discard(ref)
            return True
        return False

    def released(self, ref: int) -> BorrowTrace | None:
        """The client let ``ref`` go: the borrow whose last tensor that was, if its
        ``BorrowLastUse`` is still to send (after the deletions before it)."""
        b = self._name_borrow.pop(ref, None)
        if b is None:
            return None
        b.names.discard(ref)
        return b if not b.names and not b.last else None

    def dropped(self, alias: int) -> list[int]:
        """The ids the drop of ``alias``'s borrow ends (it and its views still held), after
        the messages Monarch's ``drop()`` sends before ``BorrowDrop``: it deletes each of
        them, and the last one's deletion is the borrow's last use."""
        b = self._borrows.pop(alias, None)
        if b is None:
            return [alias]
        if b.storage is not None:
            self._borrowed.pop(id(b.storage), None)
        names = sorted(b.names)
        for r in names:
            self._name_borrow.pop(r, None)
            self._ended.add(r)
        if not b.last:
            if len(names) > 1:
                self._next_command("DeleteRefs")  # all but the last, before BorrowLastUse
            self.last_use(b)
            self._next_command("DeleteRefs")
        return sorted({alias, *names})
