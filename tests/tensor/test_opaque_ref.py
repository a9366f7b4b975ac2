"""``OpaqueRef``: an object built by a remote function stays on the workers behind a handle."""

from __future__ import annotations

import pickle

import pytest

import danaus
from danaus.actor import ProcMesh
from danaus.common.opaque_ref import OpaqueRef

from . import helpers
from .conftest import COORDS, REPLY_TIMEOUT, torch

pytestmark = pytest.mark.torch

build = danaus.remote(helpers.build_linear, propagate=lambda seed: OpaqueRef(None))
forward = danaus.remote(helpers.linear_forward, propagate=lambda ref, x: x.new_empty(2, 4))
scale = danaus.remote(helpers.scale_linear, propagate="inspect")
forward_by_running_it = danaus.remote(helpers.linear_forward)


def _local_linear(seed: int) -> torch.nn.Linear:
    torch.manual_seed(seed)
    return torch.nn.Linear(3, 4)


def test_a_module_built_on_the_workers_is_used_by_a_later_remote_function(
    mesh: ProcMesh,
) -> None:
    with mesh.activate():
        model = build(11)
        x = torch.arange(6.0).reshape(2, 3) + mesh.rank("gpu")
        y = forward(model, x)
        scale(model, 2.0)  # replaces the worker's object: ref.value = ...
        y2 = forward(model, x)
    assert type(model) is OpaqueRef and isinstance(model._key, danaus.Tensor)
    local = _local_linear(11)
    with torch.no_grad():
        for h, g in COORDS:
            lx = torch.arange(6.0).reshape(2, 3) + g
            assert torch.allclose(danaus.inspect(y, host=h, gpu=g), local(lx)), (h, g)
            assert torch.allclose(danaus.inspect(y2, host=h, gpu=g), 2 * local(lx)), (h, g)


def test_the_client_cannot_make_read_or_write_an_opaque_ref(mesh: ProcMesh) -> None:
    with pytest.raises(RuntimeError, match="Client is attempting to create an OpaqueRef"):
        OpaqueRef(torch.nn.Linear(3, 4))
    with mesh.activate():
        model = build(1)
    with pytest.raises(RuntimeError, match="Client is attempting to access an OpaqueRef"):
        model.value  # noqa: B018
    with pytest.raises(RuntimeError, match="Client is attempting to set an OpaqueRef"):
        model.value = 3


def test_running_a_function_that_reads_the_value_on_the_client_says_to_give_propagate(
    mesh: ProcMesh,
) -> None:
    with mesh.activate():
        model = build(1)
        with pytest.raises(RuntimeError, match=r"exists only on the workers.*propagate="):
            forward_by_running_it(model, torch.zeros(2, 3))


def test_a_failed_build_fails_what_uses_the_reference(mesh: ProcMesh) -> None:
    bad = danaus.remote(helpers.fails, propagate=lambda x: OpaqueRef(None))
    with mesh.activate():
        model = bad(torch.zeros(1))
        y = forward(model, torch.zeros(2, 3))
    with pytest.raises(danaus.RemoteTensorError, match="boom from a remote function"):
        danaus.inspect(y)


def test_call_one_brings_back_a_plain_reference_the_client_cannot_read(mesh: ProcMesh) -> None:
    one = mesh.slice(host=0, gpu=0)
    with one.activate():
        ref = build.call_one(3).get(timeout=REPLY_TIMEOUT)
    assert type(ref) is OpaqueRef
    with pytest.raises(RuntimeError, match="Client is attempting to access"):
        ref.value  # noqa: B018


class Labelled(OpaqueRef):
    pass


def test_a_pickled_reference_degrades_to_a_plain_opaque_ref() -> None:
    ref = Labelled._create(torch.tensor(7))
    back = pickle.loads(pickle.dumps(ref))
    assert type(back) is OpaqueRef
    assert torch.equal(back._key, torch.tensor(7))
    assert danaus.OpaqueRef is OpaqueRef and OpaqueRef.__module__ == "danaus"
