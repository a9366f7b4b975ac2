"""Monarch names added to ``danaus.actor`` and ``danaus`` (issue 28 §3), in the client
itself: its log lines carry the root actor, and Monarch's module paths hold danaus's
objects. Actors' logs and ids on real procs: ``tests/integration/test_monarch_names.py``."""

from __future__ import annotations

import io
import logging

import danaus
import danaus.actor
from danaus.actor import context


def _capture(name: str) -> tuple[logging.Logger, io.StringIO]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger(name)
    logger.handlers[:] = [handler]
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return logger, stream


def test_client_logs_carry_the_root_once_its_context_exists() -> None:
    context()
    logger, stream = _capture("named-client")
    logger.warning("hello")
    assert stream.getvalue() == "[actor=<root>] hello\n"
    danaus.actor.config.prefix_python_logs_with_actor = False
    try:
        logger.warning("plain")
    finally:
        danaus.actor.config.prefix_python_logs_with_actor = True
    assert stream.getvalue().splitlines()[1] == "plain"


def test_monarch_module_paths_hold_the_same_objects() -> None:
    import danaus.actor.concurrent
    import danaus.common.future

    assert danaus.actor.concurrent.concurrent_endpoint is danaus.actor.concurrent_endpoint
    assert danaus.Future is danaus.ActorFuture is danaus.actor.Future
    assert danaus.common.future.Future is danaus.actor.Future
