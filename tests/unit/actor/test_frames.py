"""The filter that keeps a remote traceback to the user's frames (issue 39), in this
process: danaus's frames are told apart by the directory of the package, so that a
module moving inside it changes nothing. What reaches a caller from actors on procs:
``tests/integration/test_tracebacks.py``."""

from __future__ import annotations

import traceback
from collections.abc import Callable
from pathlib import Path

import pytest

import danaus
from danaus._actor.core.frames import is_internal_file, user_traceback
from danaus._actor.core.future import Deferred, resolve
from danaus.actor import Future

DANAUS_DIR = Path(danaus.__file__).resolve().parent


def is_danaus(filename: str) -> bool:
    return Path(filename).resolve().is_relative_to(DANAUS_DIR)


def raise_deep(value: int) -> None:
    raise ValueError(f"value {value} refused")


def _raised_through_danaus(fn: Callable[[], object]) -> BaseException:
    """The exception of ``fn()`` run by danaus's own code (a reply's decoding)."""
    try:
        resolve(Deferred(fn))
    except Exception as e:
        return e
    raise AssertionError(f"{fn!r} did not raise")


def test_user_traceback_drops_danaus_frames_above_the_users_by_directory() -> None:
    err = _raised_through_danaus(lambda: raise_deep(1))
    assert err.__traceback__ is not None
    tb = err.__traceback__.tb_next  # from the first of danaus's frames, as in a dispatch
    assert tb is not None and is_danaus(tb.tb_frame.f_code.co_filename)
    kept = user_traceback(tb)
    names = [(is_danaus(f.filename), f.name) for f in traceback.extract_tb(kept)]
    assert names == [(False, "<lambda>"), (False, "raise_deep")]
    # Any module of the package counts, wherever it lies in it; a file beside it does not.
    assert is_internal_file(str(DANAUS_DIR / "any" / "new" / "place.py"))
    assert not is_internal_file(str(DANAUS_DIR.parent / "danaus_plugin" / "mod.py"))
    assert not is_internal_file(__file__)


def test_user_traceback_keeps_a_traceback_of_danaus_frames_only_whole() -> None:
    with pytest.raises(TypeError) as info:
        Future(1)  # danaus's own misuse error: no user frame below
    tb = info.value.__traceback__
    assert tb is not None and tb.tb_next is not None
    assert user_traceback(tb.tb_next) is tb.tb_next
