"""The actor's own hooks: ``__supervise__`` and ``_handle_undeliverable_message``
between messages, ``__cleanup__`` once at its end.

`Hooks` is a part of `ActorCell`. A hook
may be a plain method or a coroutine function (a sync actor runs the coroutine
on a fresh event loop, an async one awaits it on its own); an ``Exception`` it
raises is the hook's outcome, never lost: a hook that raises or declines fails
the actor (through its `Fate`), and one that
is missing counts as declining. ``__cleanup__`` raising is logged.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

from .failing import Fate
from .inbox import HookItem, Supervise
from .invoke import run_awaitable

__all__ = ["Hooks"]

log = logging.getLogger("danaus.actor")


class Hooks:
    """Runs an actor's hooks on its thread; ``cleaned``: ``__cleanup__`` ran."""

    def __init__(self, fate: Fate) -> None:
        self._fate = fate
        self.cleaned = False

    def run_sync(self, instance: Any, item: HookItem) -> None:
        """Run ``item``'s hook of ``instance`` (a sync actor's) and settle its outcome."""
        fn = _hook(instance, item.hook)
        handled, error = False, None
        if fn is not None:
            try:
                r = fn(item.arg)
                if inspect.isawaitable(r):
                    r = run_awaitable(r)
                handled = bool(r)
            except Exception as e:
                error = e
        self._done(instance, item, handled, error)

    async def run_async(self, instance: Any, item: HookItem) -> None:
        """Run ``item``'s hook of ``instance`` (an async actor's) and settle its outcome."""
        fn = _hook(instance, item.hook)
        handled, error = False, None
        if fn is not None:
            try:
                r = fn(item.arg)
                if inspect.isawaitable(r):
                    r = await r
                handled = bool(r)
            except Exception as e:
                error = e
        self._done(instance, item, handled, error)

    def _done(
        self, instance: Any, item: HookItem, handled: bool, error: BaseException | None
    ) -> None:
        if isinstance(item, Supervise):
            has_hook = _hook(instance, item.hook) is not None
            self._fate.supervised(item.failure, handled, error, has_hook)
        else:
            self._fate.bounced(item.arg, handled, error)

    def _cleanup_once(self, instance: Any) -> Any:
        """The actor's ``__cleanup__`` the first time a cleanup is asked (None after, or
        when it has none)."""
        if self.cleaned:
            return None
        self.cleaned = True
        return _hook(instance, "__cleanup__")

    def cleanup_sync(self, instance: Any, exc: BaseException | None) -> None:
        """``__cleanup__(exc)``, once: at a stop (``None``, or the failure's exception)
        or right after the actor failed (its thread)."""
        fn = self._cleanup_once(instance)
        if fn is None:
            return
        try:
            r = fn(exc)
            if inspect.isawaitable(r):
                run_awaitable(r)
        except Exception:
            log.exception("__cleanup__ of actor %s raised", self._fate.label)

    async def cleanup_async(self, instance: Any, exc: BaseException | None) -> None:
        """`cleanup_sync()` on an async actor's loop."""
        fn = self._cleanup_once(instance)
        if fn is None:
            return
        try:
            r = fn(exc)
            if inspect.isawaitable(r):
                await r
        except Exception:
            log.exception("__cleanup__ of actor %s raised", self._fate.label)


def _hook(instance: Any, name: str) -> Any:
    return getattr(instance, name, None) if instance is not None else None
