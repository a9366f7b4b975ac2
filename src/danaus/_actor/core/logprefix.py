"""Python log records made by an actor (or the client) start with ``[actor=<instance>] ``.

Monarch prefixes the message of every ``logging`` record made while a context is
current with the running actor's qualified name, e.g. ``[actor=<root>.<mod.Cls
trainers{'gpus': 0/2}>] loss 0.3``, so that a line from many procs says who wrote it.
danaus does the same with a log record factory installed once per process (on
import of the actor core): it applies to every logger and handler, including those
added later. ``danaus.actor.config.prefix_python_logs_with_actor = False`` turns it
off. The record keeps the prefix alone in ``record.actor_prefix``. Empty messages
are left alone (torch.compile's structured trace logging uses them), and so are
danaus's own diagnostics (the ``danaus`` loggers, whose file names the proc), and code that
runs before any context exists (no actor, and the client has not yet made its
root context) gets no prefix: the factory never starts a node.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from ..._runtime.node import this_node
from . import config
from .context import _current, _Root, _thread_ctx

__all__ = ["install"]

# Per process: whether the factory is installed; the lock guards the check-and-set.
_installed = False
_lock = threading.Lock()


def _instance_now() -> Any:
    """The running actor's instance, or the client's root once it exists; None otherwise."""
    ctx = _current.get()
    if ctx is None:
        ctx = getattr(_thread_ctx, "ctx", None)
    if ctx is None:
        node = this_node(start=False)
        ctx = None if node is None else node.part(_Root).ctx
    return None if ctx is None else ctx.actor_instance


def install() -> None:
    """Wrap the current log record factory once in this process (idempotent)."""
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
        inner = logging.getLogRecordFactory()

        def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
            record = inner(*args, **kwargs)
            if (
                not config.prefix_python_logs_with_actor
                or not record.msg
                or record.name == "danaus"
                or record.name.startswith("danaus.")
            ):
                return record
            try:
                instance = _instance_now()
                if instance is not None:
                    prefix = f"[actor={instance}] "
                    record.actor_prefix = prefix
                    record.msg = f"{prefix}{record.msg}"
            except Exception:  # a log call must never fail because of its prefix
                pass
            return record

        logging.setLogRecordFactory(factory)


install()
