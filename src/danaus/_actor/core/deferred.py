"""Deferred results: a reply as received, decoded by its first reader on the reader's thread.

The I/O thread completes futures with `Deferred` values instead of
decoded ones, so that it never runs user code (unpickling a reply may run any
``__reduce__``) nor spends time on a large object. ``Future.get()``, ``await``
and the adverbs built on them call `resolve()`.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["Deferred", "resolve"]


# Deferred values elect the thread that computes each one under this lock (held only
# for that), and threads that find one being computed wait on the condition. One
# lock for all of them instead of one per value: a pipelined batch of calls makes
# a Deferred per reply, and every object the garbage collector tracks per call
# makes its collections more frequent. Per process by nature, like the values.
_ELECT = threading.Lock()  # guards every Deferred's _state, and _WAITING
_COMPUTED = threading.Condition(_ELECT)  # notified when a Deferred's _state becomes _DONE
_WAITING = [0]  # threads waiting on _COMPUTED (under _ELECT)
_TODO, _COMPUTING, _DONE = 0, 1, 2


class Deferred:
    """A result that its first reader computes, on the reader's thread.

    The I/O thread completes futures with these instead of values, so that it
    never runs user code (unpickling a reply may run any ``__reduce__``) nor
    spends time on a large object: ``Future.get()``, ``await`` and the
    adverbs built on them call `resolve()`, which computes it once and
    returns the value or raises the call's exception. ``ok`` is False when
    it is known, before computing, that it will raise.
    """

    __slots__ = ("_input", "_ok", "_state", "_value")
    ok = True

    def __init__(self, fn: Any) -> None:
        # What computing needs, dropped once computed: ``fn``, called with no arguments
        # (or what a subclass's ``_compute`` reads instead, such as a reply frame).
        self._input = fn
        self._state = _TODO
        self._ok = False
        self._value: Any = None

    def _compute(self) -> Any:
        """The value (or raise); runs once, on the first reader's thread."""
        assert self._input is not None
        return self._input()

    def resolve(self) -> Any:
        """The value (computed the first time), or raise the exception.

        The first reader computes it; a reader that comes while another computes
        waits for that one, and an interrupted computation is left for the next.
        """
        if self._state != _DONE:
            with _ELECT:
                while self._state == _COMPUTING:  # another thread computes it
                    _WAITING[0] += 1
                    try:
                        _COMPUTED.wait()
                    finally:
                        _WAITING[0] -= 1
                mine = self._state == _TODO
                if mine:
                    self._state = _COMPUTING
            if mine:
                try:
                    ok, value = True, self._compute()
                except Exception as e:
                    ok, value = False, e
                except BaseException:  # interrupted: the next reader computes it
                    with _ELECT:
                        self._state = _TODO
                        if _WAITING[0]:
                            _COMPUTED.notify_all()
                    raise
                with _ELECT:
                    self._ok, self._value = ok, value
                    self._state = _DONE
                    self._input = None  # what computing needed (a frame's bytes)
                    if _WAITING[0]:
                        _COMPUTED.notify_all()
        if self._ok:
            return self._value
        raise self._value


def resolve(value: Any) -> Any:
    """``value``, or what a `Deferred` stands for (raising its exception)."""
    if isinstance(value, Deferred):
        return value.resolve()
    return value
