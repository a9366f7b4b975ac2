"""A remote exception shows the user's frames, and of danaus's only the ``get()`` (issue 39).

Two tracebacks reach the caller: the local one, of the ``ActorError`` raised
by ``get()`` (the caller's frames, then ``get`` itself: nothing that waited
inside it), and the remote one, ``ActorError.remote_traceback`` (the user's
frames from the endpoint or ``__init__`` down, none of the dispatch that ran
it). Frames are told apart by the directory of the danaus package, so that a
module moving inside it changes nothing here. The filter itself, in one process:
``tests/unit/actor/test_frames.py``.
"""

from __future__ import annotations

import asyncio
import operator
import re
import traceback
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

import danaus
import danaus.actor
from danaus.actor import (
    Accumulator,
    Actor,
    ActorError,
    MeshFailure,
    ProcMesh,
    endpoint,
)
from danaus.testing import FaultRecorder

from .conftest import REPLY_TIMEOUT

DANAUS_DIR = Path(danaus.__file__).resolve().parent
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line \d+, in (?P<name>\S+)$', re.M)


def is_danaus(filename: str) -> bool:
    return Path(filename).resolve().is_relative_to(DANAUS_DIR)


def local_frames(err: BaseException) -> list[tuple[bool, str]]:
    """``(is danaus's, function)`` for each frame of the traceback raised to the caller."""
    return [(is_danaus(f.filename), f.name) for f in traceback.extract_tb(err.__traceback__)]


def remote_frames(text: str) -> list[tuple[bool, str]]:
    """``(is danaus's, function)`` for each frame of a remote traceback's text."""
    assert "Traceback (most recent call last)" in text, text
    return [(is_danaus(m["file"]), m["name"]) for m in _FRAME.finditer(text)]


def raise_deep(value: int) -> None:
    raise ValueError(f"value {value} refused")


def values_then_fail(n: int) -> Iterator[int]:
    yield from range(n)
    raise_deep(n)


async def async_values_then_fail(n: int) -> AsyncIterator[int]:
    for i in range(n):
        await asyncio.sleep(0)
        yield i
    raise_deep(n)


class SyncThrower(Actor):
    @endpoint
    def fail(self, value: int) -> int:
        raise_deep(value)
        return value

    @endpoint
    def fail_in_generator(self, n: int) -> int:
        return sum(values_then_fail(n))

    @endpoint
    def fail_through_another(self, other: SyncThrower) -> int:
        # The other actor's ActorError goes on up through this endpoint.
        return other.fail.call_one(5).get(timeout=REPLY_TIMEOUT)


class AsyncThrower(Actor):
    @endpoint
    async def fail(self, value: int) -> int:
        await asyncio.sleep(0)
        raise_deep(value)
        return value

    @endpoint
    async def fail_in_generator(self, n: int) -> int:
        total = 0
        async for i in async_values_then_fail(n):
            total += i
        return total


class ThrowsInInit(Actor):
    def __init__(self, value: int) -> None:
        raise_deep(value)

    @endpoint
    def ping(self) -> int:
        return 0


@pytest.fixture(scope="module")
def sync_mesh(procs: ProcMesh) -> Iterator[SyncThrower]:
    mesh = procs.spawn("tb_sync", SyncThrower)
    yield mesh
    mesh.stop().get(timeout=REPLY_TIMEOUT)


@pytest.fixture(scope="module")
def async_mesh(procs: ProcMesh) -> Iterator[AsyncThrower]:
    mesh = procs.spawn("tb_async", AsyncThrower)
    yield mesh
    mesh.stop().get(timeout=REPLY_TIMEOUT)


def assert_user_frames_then_get(err: ActorError, test_name: str, entry: str = "get") -> None:
    """The local traceback: the test's frame, then danaus's ``entry`` and nothing below."""
    frames = local_frames(err)
    assert frames[0] == (False, test_name), frames
    assert [name for ours, name in frames if ours] == [entry], frames
    assert frames[-1] == (True, entry), frames


def assert_remote_user_frames(err: ActorError, *names: str) -> None:
    """The remote traceback: exactly the user's frames ``names``, top to bottom."""
    frames = remote_frames(err.remote_traceback)
    assert frames == [(False, n) for n in names], err.remote_traceback
    assert "value" in err.remote_traceback and "refused" in err.remote_traceback


def test_sync_endpoint_error_shows_the_users_frames_and_of_danaus_only_get(
    sync_mesh: SyncThrower,
) -> None:
    with pytest.raises(ActorError) as info:
        sync_mesh.slice(gpus=0).fail.call_one(3).get(timeout=REPLY_TIMEOUT)
    assert_user_frames_then_get(
        info.value, "test_sync_endpoint_error_shows_the_users_frames_and_of_danaus_only_get"
    )
    assert_remote_user_frames(info.value, "fail", "raise_deep")


def test_async_endpoint_error_shows_only_the_users_frames(async_mesh: AsyncThrower) -> None:
    with pytest.raises(ActorError) as info:
        async_mesh.slice(gpus=1).fail.call_one(4).get(timeout=REPLY_TIMEOUT)
    assert_user_frames_then_get(info.value, "test_async_endpoint_error_shows_only_the_users_frames")
    assert_remote_user_frames(info.value, "fail", "raise_deep")


def test_gathered_call_error_shows_only_the_users_frames(sync_mesh: SyncThrower) -> None:
    with pytest.raises(ActorError) as info:
        sync_mesh.fail.call(6).get(timeout=REPLY_TIMEOUT)
    assert_user_frames_then_get(info.value, "test_gathered_call_error_shows_only_the_users_frames")
    assert_remote_user_frames(info.value, "fail", "raise_deep")


def test_result_choose_and_accumulate_end_at_get_as_well(sync_mesh: SyncThrower) -> None:
    name = "test_result_choose_and_accumulate_end_at_get_as_well"
    with pytest.raises(ActorError) as info:
        sync_mesh.fail.choose(7).result(timeout=REPLY_TIMEOUT)  # result is get
    assert_user_frames_then_get(info.value, name)
    assert_remote_user_frames(info.value, "fail", "raise_deep")
    with pytest.raises(ActorError) as info:
        Accumulator(sync_mesh.fail, 0, operator.add).accumulate(7).get(timeout=REPLY_TIMEOUT)
    assert_user_frames_then_get(info.value, name)
    assert_remote_user_frames(info.value, "fail", "raise_deep")


def test_stream_of_a_failing_generator_shows_the_generators_frames(
    sync_mesh: SyncThrower,
) -> None:
    futures = list(sync_mesh.fail_in_generator.stream(2))
    assert len(futures) == 2
    for fut in futures:
        with pytest.raises(ActorError) as info:
            fut.get(timeout=REPLY_TIMEOUT)
        assert_user_frames_then_get(
            info.value, "test_stream_of_a_failing_generator_shows_the_generators_frames"
        )
        assert_remote_user_frames(info.value, "fail_in_generator", "values_then_fail", "raise_deep")


def test_async_generator_in_an_async_endpoint_shows_the_generators_frames(
    async_mesh: AsyncThrower,
) -> None:
    for fut in async_mesh.fail_in_generator.stream(3):
        with pytest.raises(ActorError) as info:
            fut.get(timeout=REPLY_TIMEOUT)
        assert_remote_user_frames(
            info.value, "fail_in_generator", "async_values_then_fail", "raise_deep"
        )


def test_awaited_future_ends_the_local_traceback_at_await(sync_mesh: SyncThrower) -> None:
    async def caller() -> int:
        return await sync_mesh.slice(gpus=1).fail.call_one(8)

    with pytest.raises(ActorError) as info:
        asyncio.run(asyncio.wait_for(caller(), REPLY_TIMEOUT))
    frames = local_frames(info.value)
    # asyncio's own frames (run, the task) sit between the test and the coroutine.
    assert (False, "caller") in frames, frames
    below = frames[frames.index((False, "caller")) + 1 :]
    assert below == [(True, "__await__")], frames
    assert_remote_user_frames(info.value, "fail", "raise_deep")


def test_error_passed_on_by_an_endpoint_shows_its_get_and_the_other_actors_frames(
    sync_mesh: SyncThrower,
) -> None:
    with pytest.raises(ActorError) as info:
        sync_mesh.slice(gpus=0).fail_through_another.call_one(sync_mesh.slice(gpus=1)).get(
            timeout=REPLY_TIMEOUT
        )
    # The outer text holds the inner error's text (its own remote traceback) after its own frames.
    text = info.value.remote_traceback
    outer = remote_frames(text.split("Traceback of where the remote call failed", 1)[0])
    assert outer == [(False, "fail_through_another"), (True, "get")], text
    inner = info.value.exception
    assert isinstance(inner, ActorError)
    assert_remote_user_frames(inner, "fail", "raise_deep")


def test_init_failure_shows_only_the_users_frames_to_the_caller_and_the_owner(
    procs: ProcMesh, monkeypatch: pytest.MonkeyPatch
) -> None:
    faults = FaultRecorder()
    monkeypatch.setattr(danaus.actor, "unhandled_fault_hook", faults)
    mesh = procs.slice(gpus=0).spawn("tb_init", ThrowsInInit, 9)
    with pytest.raises(ActorError) as info:
        mesh.initialized.get(timeout=REPLY_TIMEOUT)
    assert_user_frames_then_get(
        info.value, "test_init_failure_shows_only_the_users_frames_to_the_caller_and_the_owner"
    )
    assert_remote_user_frames(info.value, "__init__", "raise_deep")
    (failure,) = faults.wait(1, timeout=REPLY_TIMEOUT)
    assert isinstance(failure, MeshFailure)
    assert remote_frames(failure.traceback) == [(False, "__init__"), (False, "raise_deep")]
    mesh.stop().get(timeout=REPLY_TIMEOUT)
    assert faults.unseen() == []
