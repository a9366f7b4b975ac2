"""Deferred results: a reply as received, decoded by its first reader on the reader's thread.

The I/O thread completes futures with `Deferred` values instead of
decoded ones, so that it never runs user code (unpickling a reply may run any
``__reduce__``) nor spends time on a large object. ``Future.get()``, ``await``
and the adverbs built on them call `resolve()`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

__all__ = ["Deferred", "resolve"]


# Deferred values elect the thread that computes each one under this lock (held only
# for that), and threads that find one being computed wait on the condition. One
# lock for all of them instead of one per value: a pipelined batch of calls makes
# a Deferred per reply, and every object the garbage collector tracks per call
# makes its collections more frequent. Per process by nature, like the values.
_ELECT = threading.Lock()  # guards every Deferred's _input (its state), and _WAITING
_COMPUTED = threading.Condition(_ELECT)  # notified when a Deferred's value is computed
_WAITING = [0]  # threads waiting on _COMPUTED (under _ELECT)


# What a Deferred's ``_input`` holds once taken: it is being computed, or it is done.
_COMPUTING, _DONE = object(), object()


class Deferred:
    """A result that its first reader computes, on the reader's thread.

    The I/O thread completes futures with these instead of values, so that it
    never runs user code (unpickling a reply may run any ``__reduce__``) nor
    spends time on a large object: ``Future.get()``, ``await`` and the
    adverbs built on them call `resolve()`, which computes it once and
    returns the value or raises the call's exception. ``ok`` is False when
    it is known, before computing, that it will raise.

    Its one field before that is ``_input``, what computing needs: a function
    of no arguments here, what a subclass's ``_compute`` reads there (which
    sets ``_input`` itself, in place of calling this ``__init__``). While it
    is computed ``_input`` is ``_COMPUTING``, then ``_DONE``, with the
    outcome in ``_ok`` and ``_value``.
    """

    __slots__ = ("_input", "_ok", "_value")
    ok = True

    def __init__(self, fn: Callable[[], Any]) -> None:
        self._input: Any = fn

    def _compute(self, fn: Any) -> Any:
        """The value of input ``fn`` (or raise); runs once, on the first reader's thread."""
        return fn()

    def resolve(self) -> Any:
        """The value (computed the first time), or raise the exception.

        The first reader computes it; a reader that comes while another computes
        waits for that one, and an interrupted computation is left for the next.
        """
        if self._input is not _DONE:
            with _ELECT:
                while self._input is _COMPUTING:  # another thread computes it
                    _WAITING[0] += 1
                    try:
                        _COMPUTED.wait()
                    finally:
                        _WAITING[0] -= 1
                todo = self._input
                if todo is not _DONE:
                    self._input = _COMPUTING
            if todo is not _DONE:
                try:
                    ok, value = True, self._compute(todo)
                except Exception as e:
                    ok, value = False, e
                except BaseException:  # interrupted: the next reader computes it
                    with _ELECT:
                        self._input = todo
                        if _WAITING[0]:
                            _COMPUTED.notify_all()
                    raise
                with _ELECT:
                    self._ok, self._value = ok, value
                    self._input = _DONE  # and what computing needed (a frame's bytes) goes
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
