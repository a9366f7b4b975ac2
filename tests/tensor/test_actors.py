"""Distributed tensors passed to actor endpoints: each actor gets its proc's local shard.

Monarch's rule (``mesh_controller.create_actor_message_kind``): the call is
ordered with the tensor ops on the tensor's stream both ways; the endpoint
gets the shard itself (what it writes in place, later ops see).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest

import danaus
from danaus.actor import Actor, ProcMesh, endpoint

from .conftest import COORDS, REPLY_TIMEOUT, base, engine_device, failures_of, local_base, torch

# The first test also spawns the actors, whose procs import this module and torch: on a
# loaded machine that alone took over 30 s (the bound on each test stays).
pytestmark = [pytest.mark.torch, pytest.mark.timeout(180)]
ACTOR_INIT_TIMEOUT = 150.0


class ShardUser(Actor):
    def __init__(self) -> None:
        self.log: list[Any] = []

    @endpoint
    def describe(self, x: Any, extra: Any = None) -> dict[str, Any]:
        self.log.append(("describe", x.tolist()))
        out = {
            "type": type(x).__module__ + "." + type(x).__qualname__,
            "device": x.device.type,  # the engine's (tensor_device): the shard is not copied
            "value": x.to("cpu", copy=True),
        }
        if extra is not None:
            out["extra"] = {k: v.to("cpu", copy=True) for k, v in extra.items()}
        return out

    @endpoint
    def scale_in_place(self, x: Any, k: float) -> None:
        x.mul_(k)

    @endpoint
    def note(self, what: str) -> None:
        self.log.append(what)

    @endpoint
    def history(self) -> list[Any]:
        return self.log

    @endpoint
    def fail_with(self, x: Any) -> None:
        raise ValueError(f"endpoint failed on a shard of shape {list(x.shape)}")


class AsyncShardUser(Actor):
    @endpoint
    async def total(self, x: Any) -> float:
        return float(x.sum())


@pytest.fixture(scope="module")
def users(mesh: ProcMesh) -> Iterable[Any]:
    am = mesh.spawn("shard_users", ShardUser)
    am.initialized.get(timeout=ACTOR_INIT_TIMEOUT)
    yield am
    am.stop().get(timeout=REPLY_TIMEOUT)


def _by_coord(vm: Any) -> dict[tuple[int, int], Any]:
    return {(p["host"], p["gpu"]): v for p, v in vm.items()}


def test_an_endpoint_receives_its_procs_local_shard_as_a_torch_tensor(
    mesh: ProcMesh, users: Any
) -> None:
    with mesh.activate():
        x = base(mesh)
        extra = {"twice": x * 2}
    got = _by_coord(users.describe.call(x, extra=extra).get(timeout=REPLY_TIMEOUT))
    assert set(got) == set(COORDS)
    for (h, g), v in got.items():
        assert v["type"] == "torch.Tensor"
        assert v["device"] == engine_device().type
        assert torch.equal(v["value"], local_base(h, g))
        assert torch.equal(v["extra"]["twice"], local_base(h, g) * 2)


def test_calls_and_tensor_ops_run_in_the_order_the_client_issued_them(
    mesh: ProcMesh, users: Any
) -> None:
    with mesh.activate():
        x = base(mesh)
        x.add_(1)  # the endpoint sees this op
        seen = users.describe.call(x)
        users.scale_in_place.call(x, 3.0)  # writes the shard in place
        y = x + 0  # issued after that call: sees its write, though nobody waited for it
        x.sub_(5)
        seen_after = users.describe.call(x)
    before = _by_coord(seen.get(timeout=REPLY_TIMEOUT))
    after = _by_coord(seen_after.get(timeout=REPLY_TIMEOUT))
    for h, g in COORDS:
        expect = local_base(h, g) + 1
        assert torch.equal(before[(h, g)]["value"], expect)
        assert torch.equal(danaus.inspect(y, host=h, gpu=g), expect * 3)
        assert torch.equal(after[(h, g)]["value"], expect * 3 - 5)
        assert torch.equal(danaus.inspect(x, host=h, gpu=g), expect * 3 - 5)


def test_actor_messages_with_and_without_tensors_keep_their_order(
    mesh: ProcMesh, users: Any
) -> None:
    users.history.call().get(timeout=REPLY_TIMEOUT)
    with mesh.activate():
        x = base(mesh)
        users.note.broadcast("first")
        users.describe.broadcast(x)
        x.mul_(-1)
        users.note.broadcast("second")
        users.describe.broadcast(x)
    logs = _by_coord(users.history.call().get(timeout=REPLY_TIMEOUT))
    for h, g in COORDS:
        tail = logs[(h, g)][-4:]
        base_list = local_base(h, g).tolist()
        assert tail == [
            "first",
            ("describe", base_list),
            "second",
            ("describe", [-v for v in base_list]),
        ]


def test_a_slice_of_the_actors_gets_the_shards_of_its_procs(mesh: ProcMesh, users: Any) -> None:
    with mesh.activate():
        x = base(mesh)
    vm = users.slice(host=1).describe.call(x).get(timeout=REPLY_TIMEOUT)
    got = {p["gpu"]: v for p, v in vm.items()}  # the slice has only the gpu dimension
    assert set(got) == {0, 1}
    for g, v in got.items():
        assert torch.equal(v["value"], local_base(1, g))
    one = users.slice(host=0, gpu=1).describe.call_one(x).get(timeout=REPLY_TIMEOUT)
    assert torch.equal(one["value"], local_base(0, 1))


def test_an_async_endpoint_receives_the_shard_too(mesh: ProcMesh) -> None:
    am = mesh.spawn("async_shard_users", AsyncShardUser)
    try:
        with mesh.activate():
            x = base(mesh)
            totals = am.total.call(x)
            x.zero_()
            zero = am.total.call(x)
        got = _by_coord(totals.get(timeout=REPLY_TIMEOUT))
        zeros = _by_coord(zero.get(timeout=REPLY_TIMEOUT))
        for h, g in COORDS:
            assert got[(h, g)] == float(local_base(h, g).sum())
            assert zeros[(h, g)] == 0.0
    finally:
        am.stop().get(timeout=REPLY_TIMEOUT)


def test_an_actor_outside_the_tensors_mesh_is_refused_before_sending(
    mesh: ProcMesh, users: Any
) -> None:
    half = mesh.slice(host=0)
    with half.activate():
        x = torch.ones(3)
    with pytest.raises(ValueError, match="outside that mesh") as info:
        users.describe.call(x)
    assert "rank 2" in str(info.value)  # (host=1, gpu=0), the first actor off the slice
    # the actors on the slice's procs may receive it
    vm = users.slice(host=0).describe.call(x).get(timeout=REPLY_TIMEOUT)
    assert len(list(vm.values())) == 2
    assert all(torch.equal(v["value"], torch.ones(3)) for v in vm.values())


def test_a_failed_tensor_makes_the_call_raise_and_the_stream_goes_on(
    mesh: ProcMesh, users: Any
) -> None:
    with mesh.activate():
        x = base(mesh)
        bad = x[torch.tensor([7])]  # index out of range on every worker
        call = users.describe.call(bad)
        failing = users.fail_with.call(x)
        y = x + 1
    with pytest.raises(Exception, match="index") as info:
        call.get(timeout=REPLY_TIMEOUT)
    assert "aten::index" in str(info.value)
    with pytest.raises(Exception, match="endpoint failed on a shard of shape \\[6\\]"):
        failing.get(timeout=REPLY_TIMEOUT)
    assert torch.equal(danaus.inspect(y, host=1, gpu=1), local_base(1, 1) + 1)


def test_a_tensor_cannot_be_pickled_except_as_an_endpoint_argument(mesh: ProcMesh) -> None:
    from danaus._wire import codec

    with mesh.activate():
        x = base(mesh)
    with pytest.raises(TypeError, match="values live on the workers"):
        codec.dumps(x)
    with pytest.raises(TypeError, match="cannot be pickled"):
        mesh.spawn("holds_a_tensor", ShardUser, x)  # constructor arguments are not handed off


def test_tensors_of_two_streams_in_one_call_are_refused(mesh: ProcMesh, users: Any) -> None:
    comms = danaus.Stream("actor_test_comms")
    with mesh.activate():
        x = base(mesh)
        with comms.activate():
            y = torch.zeros(2)
        with pytest.raises(ValueError, match="one stream"):
            users.describe.call(x, extra={"y": y})
        view, borrow = comms.borrow(x, mutable=True)
        with pytest.raises(ValueError, match="lent mutably"):
            users.describe.call(x)
        with comms.activate():
            got = _by_coord(users.describe.call(view).get(timeout=REPLY_TIMEOUT))
        borrow.drop()
    assert torch.equal(got[(1, 0)]["value"], local_base(1, 0))


def test_an_actor_that_failed_before_the_call_releases_the_stream(mesh: ProcMesh) -> None:
    am = mesh.spawn("doomed_shard_users", ShardUser)
    am.initialized.get(timeout=ACTOR_INIT_TIMEOUT)
    try:
        with failures_of("doomed_shard_users", 4), mesh.activate():
            x = base(mesh)
            am.fail_with.broadcast(x)  # a broadcast's exception fails the actor
            never = am.describe.call(x)  # queued behind it: will not run
            y = x + 1  # the stream must not wait for that call forever
        assert torch.equal(danaus.inspect(y, host=1, gpu=1), local_base(1, 1) + 1)
        with pytest.raises(Exception, match="endpoint failed on a shard"):
            never.get(timeout=REPLY_TIMEOUT)
    finally:
        am.stop().get(timeout=REPLY_TIMEOUT)
