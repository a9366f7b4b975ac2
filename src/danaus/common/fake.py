"""Monarch's ``monarch.common.fake``: ``fake_call`` runs a function under torch's
``FakeTensorMode`` (tensors with sizes, dtypes and devices but no data).

As Monarch's, it runs ``fn`` on one worker thread of its own, so that a mesh's
dispatch mode active on the caller's thread does not apply. danaus itself
propagates shapes with meta tensors (``docs/tensor.md``); this is for code that
builds fake tensors as Monarch's tools do. Needs torch.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from functools import cache
from typing import Any

from torch._subclasses.fake_tensor import FakeTensorMode

__all__ = ["fake_call"]


@cache
def _fake_mode_worker() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="danaus-fake")


@cache
def _fake_mode() -> FakeTensorMode:
    return FakeTensorMode()


def fake_call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` under ``FakeTensorMode``, on the fake-mode thread; its
    result (fake tensors for the tensors it made). Blocks until it returns; raises what
    ``fn`` raises."""

    def work() -> Any:
        with _fake_mode():  # entered on the worker thread: no mode of the caller's applies
            return fn(*args, **kwargs)

    return _fake_mode_worker().submit(work).result()
