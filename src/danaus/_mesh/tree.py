"""The cast tree: which proc forwards a message to which, and which ranks a cast selects.

Pure arithmetic over the *base ranks* ``0..n-1`` of an actor mesh (every
dimension folded into one row-major rank space). The tree depends only on
``n`` and the fan-out, never on which ranks a message selects, so the path
from a sender to a rank is the same for every message it sends to that mesh:
per-hop FIFO then gives per-sender FIFO for every destination, whatever
slice each message addressed. A message to a slice is *pruned*: it goes only
into subtrees holding a selected rank.

Shape: the sender is the root; it splits ``[0, n)`` into at most ``fanout``
contiguous chunks of near-equal size. The first rank ``lo`` of a chunk
``[lo, hi)`` is that subtree's node: it keeps rank ``lo`` for itself and
splits ``[lo + 1, hi)`` the same way. So a node's subtree is always a
contiguous range of ranks, and a tree of ``n`` ranks is about
``log_fanout(n)`` hops deep:

    sender ── [0,4) ── 0 ─┬─ 1        n = 16, fanout = 4
           │              ├─ 2
           │              └─ 3
           ├─ [4,8) ── 4 ─┬─ 5 ...
           ...

A [`Selection`][danaus.Selection] is the set of base ranks a message addresses, and the
*slot* of each (its index in the caller's slice, which is where its reply
goes). A strided slice whose ranks increase with their index (every slice
cut from a row-major mesh with positive steps) is kept as its
``(offset, sizes, strides)`` and answers every question in O(ndim); any
other set of ranks is kept as a sorted list.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Iterator, Sequence
from typing import Any

from .slice import Slice

__all__ = [
    "Selection",
    "chunks",
    "depth",
    "node_children",
    "node_range",
    "path",
    "root_children",
]


@functools.lru_cache(maxsize=1 << 16)
def chunks(lo: int, hi: int, fanout: int) -> tuple[tuple[int, int], ...]:
    """``[lo, hi)`` cut into at most ``fanout`` contiguous, near-equal, non-empty ranges."""
    n = hi - lo
    if n <= 0:
        return ()
    k = min(fanout, n)
    return tuple((lo + (i * n) // k, lo + ((i + 1) * n) // k) for i in range(k))


def root_children(n: int, fanout: int) -> tuple[tuple[int, int], ...]:
    """The subtrees the sender sends to directly."""
    return chunks(0, n, fanout)


def node_children(lo: int, hi: int, fanout: int) -> tuple[tuple[int, int], ...]:
    """The subtrees node ``lo`` (whose subtree is ``[lo, hi)``) forwards to."""
    return chunks(lo + 1, hi, fanout)


def node_range(rank: int, n: int, fanout: int) -> tuple[int, int]:
    """The subtree ``[lo, hi)`` whose node is ``rank``. ``ValueError`` if out of range."""
    return path(rank, n, fanout)[-1]


def path(rank: int, n: int, fanout: int) -> list[tuple[int, int]]:
    """The subtrees a message to ``rank`` passes through, from the sender's child down to
    ``rank``'s own (``node_range``). O(depth). ``ValueError`` if out of range."""
    if not 0 <= rank < n:
        raise ValueError(f"rank {rank!r} is not in a mesh of {n} ranks")
    out = []
    lo, hi = 0, n
    while True:
        size = hi - lo
        k = min(fanout, size)
        i = ((rank - lo + 1) * k - 1) // size
        a, b = lo + (i * size) // k, lo + ((i + 1) * size) // k
        out.append((a, b))
        if a == rank:
            return out
        lo, hi = a + 1, b


def depth(n: int, fanout: int) -> int:
    """Hops from the sender to the deepest rank of a tree of ``n`` ranks (0 if empty)."""

    def sub(lo: int, hi: int) -> int:
        kids = node_children(lo, hi, fanout)
        return 1 + max((sub(a, b) for a, b in (*kids[:1], *kids[-1:])), default=0)

    return max((sub(a, b) for a, b in root_children(n, fanout)), default=0)


class Selection:
    """The base ranks a message selects, each with its slot.

    Build with `of()` (from the slice of a mesh) or `from_wire()`.
    """

    __slots__ = (
        "_contig",
        "_inner",
        "_list",
        "_n",
        "_off",
        "_ranks",
        "_sizes",
        "_slots",
        "_spans",
        "_str",
    )

    _list: bool
    _contig: bool
    _off: int
    _sizes: tuple[int, ...]
    _str: tuple[int, ...]
    _inner: list[int]
    _spans: list[int]
    _n: int
    _ranks: tuple[int, ...]
    _slots: tuple[int, ...]

    def __init__(self) -> None:
        raise TypeError("use Selection.of(slice) or Selection.from_wire(...)")

    @classmethod
    def of(cls, s: Slice) -> Selection:
        """The selection of the ranks of ``s``; slot ``i`` is ``s[i]``."""
        dims = [(z, t) for z, t in zip(s.sizes, s.strides, strict=True) if z != 1]
        if any(z == 0 for z, _ in dims):
            return cls._strided(s.offset, (0,), (1,))
        sizes = tuple(z for z, _ in dims)
        strides = tuple(t for _, t in dims)
        if _increasing(sizes, strides):
            return cls._strided(s.offset, sizes, strides)
        ranks = list(s)
        order = sorted(range(len(ranks)), key=ranks.__getitem__)
        return cls._listed(tuple(ranks[i] for i in order), tuple(order))

    @classmethod
    def _strided(cls, offset: int, sizes: tuple[int, ...], strides: tuple[int, ...]) -> Selection:
        self = object.__new__(cls)
        self._list = False
        self._off, self._sizes, self._str = offset, sizes, strides
        self._inner = [1] * len(sizes)
        self._spans = [0] * len(sizes)
        for d in range(len(sizes) - 2, -1, -1):
            self._inner[d] = self._inner[d + 1] * sizes[d + 1]
            self._spans[d] = self._spans[d + 1] + (sizes[d + 1] - 1) * strides[d + 1]
        self._n = self._inner[0] * sizes[0] if sizes else 1
        self._ranks = self._slots = ()
        # one contiguous run of ranks (a whole mesh, or a slice of its outer dimension)
        self._contig = all(self._inner[d] == strides[d] for d in range(len(sizes)))
        return self

    @classmethod
    def _listed(cls, ranks: tuple[int, ...], slots: tuple[int, ...]) -> Selection:
        self = object.__new__(cls)
        self._list = True
        self._ranks, self._slots = ranks, slots
        self._n = len(ranks)
        self._contig = False
        self._off, self._sizes, self._str = 0, (), ()
        self._inner, self._spans = [], []
        if len(set(ranks)) != len(ranks):
            raise ValueError(f"a selection names a rank twice: {ranks!r:.200}")
        return self

    def to_wire(self) -> tuple[Any, ...]:
        """A tuple of builtins for a frame header."""
        if self._list:
            return ("l", self._ranks, self._slots)
        return ("s", self._off, self._sizes, self._str)

    @classmethod
    def from_wire(cls, t: Sequence[Any]) -> Selection:
        """The selection ``to_wire`` described; ``ValueError`` if ``t`` is not one."""
        try:
            if t[0] == "s" and len(t) == 4:
                off, sizes, strides = int(t[1]), tuple(t[2]), tuple(t[3])
                if len(sizes) != len(strides) or not _increasing(sizes, strides):
                    raise ValueError("not an increasing strided slice")
                return cls._strided(off, sizes, strides)
            if t[0] == "l" and len(t) == 3 and len(t[1]) == len(t[2]):
                ranks = tuple(t[1])
                if list(ranks) != sorted(ranks):
                    raise ValueError("ranks not sorted")
                return cls._listed(ranks, tuple(t[2]))
        except (TypeError, IndexError) as e:
            raise ValueError(f"malformed selection {t!r:.200}: {e}") from e
        raise ValueError(f"malformed selection {t!r:.200}")

    def __len__(self) -> int:
        return self._n

    def count_below(self, x: int) -> int:
        """How many selected ranks are ``< x``."""
        if self._contig:
            x -= self._off
            return 0 if x <= 0 else x if x < self._n else self._n
        if self._list:
            return bisect.bisect_left(self._ranks, x)
        x -= self._off
        total = 0
        for d, size in enumerate(self._sizes):
            if x <= 0:
                return total
            room = x - self._spans[d] - 1
            full = room // self._str[d] + 1 if room >= 0 else 0
            if full >= size:
                return total + size * self._inner[d]
            total += full * self._inner[d]
            x -= full * self._str[d]
        return total + (1 if x > 0 and not self._sizes else 0)

    def count_in(self, lo: int, hi: int) -> int:
        """How many selected ranks are in ``[lo, hi)``."""
        return self.count_below(hi) - self.count_below(lo)

    def __contains__(self, rank: object) -> bool:
        return isinstance(rank, int) and self.count_in(rank, rank + 1) == 1

    def slot_at(self, i: int) -> int:
        """The slot of the ``i``-th selected rank in rank order."""
        return self._slots[i] if self._list else i

    def slot(self, rank: int) -> int:
        """The slot of selected rank ``rank``."""
        i = self.count_below(rank)
        return self._slots[i] if self._list else i

    def ranks_in(self, lo: int, hi: int) -> Iterator[tuple[int, int]]:
        """``(slot, rank)`` of each selected rank in ``[lo, hi)``, in rank order."""
        a, b = self.count_below(lo), self.count_below(hi)
        if self._list:
            for i in range(a, b):
                yield self._slots[i], self._ranks[i]
            return
        for i in range(a, b):
            yield i, self._rank_at(i)

    def _rank_at(self, i: int) -> int:
        r = self._off
        for d in range(len(self._sizes)):
            q, i = divmod(i, self._inner[d])
            r += q * self._str[d]
        return r

    def __repr__(self) -> str:
        return f"Selection({self.to_wire()!r:.120})"


def _increasing(sizes: Sequence[int], strides: Sequence[int]) -> bool:
    """Whether ranks grow with the row-major index (positive strides, nested blocks)."""
    span = 0
    for size, stride in zip(reversed(sizes), reversed(strides), strict=True):
        if size < 0 or stride <= span:
            return False
        span += (size - 1) * stride
    return True
