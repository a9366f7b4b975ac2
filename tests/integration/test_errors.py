"""Endpoint exceptions reach the caller as ActorError; the actor survives."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from danaus.actor import Actor, ActorError, ActorMesh, ProcMesh, endpoint

from .conftest import REPLY_TIMEOUT


class DomainError(Exception):
    def __init__(self, code: int, detail: str) -> None:
        super().__init__(code, detail)
        self.code = code
        self.detail = detail


class Unpicklable(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.lock = threading.Lock()


def deep_helper_that_raises(value: int) -> None:
    raise ValueError(f"value {value} is not acceptable")


class Faulty(Actor):
    def __init__(self) -> None:
        self.calls = 0

    @endpoint
    def fail_plain(self, value: int) -> None:
        self.calls += 1
        deep_helper_that_raises(value)

    @endpoint
    def fail_chained(self) -> None:
        self.calls += 1
        try:
            {}["missing-key"]
        except KeyError as e:
            raise RuntimeError("lookup failed while loading") from e

    @endpoint
    def fail_in_handler(self) -> None:
        self.calls += 1
        try:
            _ = 1 / 0
        except ZeroDivisionError:
            raise LookupError("while handling the division")  # noqa: B904

    @endpoint
    def fail_custom(self) -> None:
        self.calls += 1
        raise DomainError(7, "custom failure")

    @endpoint
    def fail_unpicklable(self) -> None:
        self.calls += 1
        raise Unpicklable("holds a lock")

    @endpoint
    def return_unpicklable(self) -> threading.Lock:
        self.calls += 1
        return threading.Lock()

    @endpoint
    def fail_on_rank(self, rank: int) -> int:
        from danaus.actor import current_rank

        self.calls += 1
        if current_rank().rank == rank:
            raise IndexError(f"rank {rank} refuses")
        return current_rank().rank

    @endpoint
    def ok(self) -> int:
        self.calls += 1
        return self.calls


class AsyncFaulty(Actor):
    @endpoint
    async def fail(self) -> None:
        raise ValueError("async endpoint failure")

    @endpoint
    async def ok(self) -> str:
        return "alive"


@pytest.fixture(scope="module")
def faulty(procs: ProcMesh) -> Iterator[ActorMesh[Faulty]]:
    mesh = procs.spawn("faulty", Faulty)
    yield mesh
    mesh.stop().get(timeout=REPLY_TIMEOUT)


def test_endpoint_exception_reaches_the_caller_as_actor_error(faulty) -> None:
    with pytest.raises(ActorError) as info:
        faulty.slice(gpus=0).fail_plain.call_one(13).get(timeout=REPLY_TIMEOUT)
    err = info.value
    assert isinstance(err.exception, ValueError)
    assert err.exception.args == ("value 13 is not acceptable",)


def test_actor_error_text_shows_remote_type_message_and_traceback(faulty) -> None:
    with pytest.raises(ActorError) as info:
        faulty.slice(gpus=0).fail_plain.call_one(21).get(timeout=REPLY_TIMEOUT)
    text = str(info.value)
    assert "ValueError" in text
    assert "value 21 is not acceptable" in text
    assert "remote" in text.lower()
    assert "Traceback" in text
    # The remote frames are there, down to the helper that raised.
    assert "deep_helper_that_raises" in text
    assert "fail_plain" in text


def test_actor_error_text_includes_chained_causes(faulty) -> None:
    with pytest.raises(ActorError) as info:
        faulty.slice(gpus=1).fail_chained.call_one().get(timeout=REPLY_TIMEOUT)
    text = str(info.value)
    assert isinstance(info.value.exception, RuntimeError)
    assert "lookup failed while loading" in text
    assert "KeyError" in text
    assert "missing-key" in text
    assert "direct cause" in text


def test_actor_error_text_includes_the_exception_being_handled(faulty) -> None:
    with pytest.raises(ActorError) as info:
        faulty.slice(gpus=1).fail_in_handler.call_one().get(timeout=REPLY_TIMEOUT)
    text = str(info.value)
    assert "ZeroDivisionError" in text
    assert "LookupError" in text
    assert "while handling the division" in text


def test_actor_error_keeps_custom_exception_fields(faulty) -> None:
    with pytest.raises(ActorError) as info:
        faulty.slice(gpus=0).fail_custom.call_one().get(timeout=REPLY_TIMEOUT)
    exc = info.value.exception
    assert isinstance(exc, DomainError)
    assert (exc.code, exc.detail) == (7, "custom failure")


def test_unpicklable_remote_exception_still_reaches_the_caller(faulty) -> None:
    with pytest.raises(ActorError) as info:
        faulty.slice(gpus=0).fail_unpicklable.call_one().get(timeout=REPLY_TIMEOUT)
    text = str(info.value)
    assert "Unpicklable" in text
    assert "holds a lock" in text


def test_unpicklable_return_value_fails_the_call_instead_of_hanging(faulty) -> None:
    with pytest.raises(ActorError) as info:
        faulty.slice(gpus=1).return_unpicklable.call_one().get(timeout=REPLY_TIMEOUT)
    assert isinstance(info.value.exception, TypeError)


def test_call_raises_when_any_rank_raised(faulty) -> None:
    with pytest.raises(ActorError) as info:
        faulty.fail_on_rank.call(1).get(timeout=REPLY_TIMEOUT)
    assert isinstance(info.value.exception, IndexError)
    assert "rank 1 refuses" in str(info.value)


def test_stream_fails_only_the_future_of_the_rank_that_raised(faulty) -> None:
    outcomes = []
    for fut in faulty.fail_on_rank.stream(0):
        exc = fut.exception(timeout=REPLY_TIMEOUT)
        outcomes.append("error" if isinstance(exc, ActorError) else fut.get())
    assert sorted(outcomes, key=str) == [1, "error"]


def test_actor_keeps_working_after_an_endpoint_raised(faulty) -> None:
    one = faulty.slice(gpus=0)
    before = one.ok.call_one().get(timeout=REPLY_TIMEOUT)
    with pytest.raises(ActorError):
        one.fail_plain.call_one(1).get(timeout=REPLY_TIMEOUT)
    with pytest.raises(ActorError):
        one.fail_chained.call_one().get(timeout=REPLY_TIMEOUT)
    # State survived and the failing calls ran (each counted once).
    assert one.ok.call_one().get(timeout=REPLY_TIMEOUT) == before + 3


def test_async_endpoint_exception_reaches_the_caller_and_actor_survives(procs: ProcMesh) -> None:
    mesh = procs.spawn("async_faulty", AsyncFaulty)
    with pytest.raises(ActorError) as info:
        mesh.fail.call().get(timeout=REPLY_TIMEOUT)
    assert isinstance(info.value.exception, ValueError)
    assert "async endpoint failure" in str(info.value)
    assert list(mesh.ok.call().get(timeout=REPLY_TIMEOUT).values()) == ["alive", "alive"]
    mesh.stop().get(timeout=REPLY_TIMEOUT)


def test_actor_error_is_importable_from_the_public_module(faulty) -> None:
    with pytest.raises(ActorError) as info:
        faulty.slice(gpus=0).fail_custom.call_one().get(timeout=REPLY_TIMEOUT)
    assert type(info.value).__module__ == "danaus.actor"
    assert type(info.value).__name__ == "ActorError"
