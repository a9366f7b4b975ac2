"""Monarch's ``monarch.common.messages``, ``client``, ``fake``, ``device_mesh.DeviceMesh`` and
``monarch.simulator.mock_controller``/``profiling`` as danaus provides them (issue 42)."""

from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch")

from danaus import NDSlice  # noqa: E402
from danaus.common import messages  # noqa: E402
from danaus.common.client import Client  # noqa: E402
from danaus.common.device_mesh import DeviceMesh  # noqa: E402
from danaus.common.fake import fake_call  # noqa: E402
from danaus.simulator.mock_controller import MockController  # noqa: E402
from danaus.simulator.profiling import RuntimeEstimator, RuntimeProfiler, TimingType  # noqa: E402


def test_messages_have_monarchs_fields() -> None:
    assert messages.SendTensor._fields == (
        "result",
        "from_ranks",
        "to_ranks",
        "tensor",
        "factory",
        "from_stream",
        "to_stream",
    )
    assert messages.Reduce._fields[-4:] == ("reduction", "scatter", "inplace", "out")
    assert messages.BackendNetworkInit() == (None, None)
    assert messages.DependentOnError(7).ident == 7


def test_fake_call_runs_under_fake_tensor_mode_on_its_own_thread() -> None:
    seen: list[str] = []

    def f() -> torch.Tensor:
        seen.append(threading.current_thread().name)
        t = torch.randn(100, 100)
        return t @ t

    out = fake_call(f)
    assert type(out).__name__ == "FakeTensor" and out.shape == (100, 100)
    assert seen[0] != threading.current_thread().name
    with pytest.raises(ZeroDivisionError):
        fake_call(lambda: 1 / 0)


def test_a_device_mesh_over_a_mock_controller_slices_splits_and_flattens() -> None:
    # Monarch's test_device_mesh
    ranks = NDSlice(offset=0, sizes=[2, 3, 4], strides=[12, 4, 1])
    ctrl = MockController(1, False)
    client = Client(ctrl, ctrl.world_size, ctrl.gpu_per_host)
    dm = DeviceMesh(client, ranks, ("a", "b", "c"))
    assert dm(a=0, b=0, c=0).processes[0] == 0
    x = dm(a=0, b=0)
    assert x.processes[:] == ranks[0:4] == (0, 1, 2, 3)
    assert x.names == ("c",) and x.processes.sizes == [4]
    assert dm(b=2, c=3).processes[:] == (11, 23)
    dm2 = DeviceMesh(client, NDSlice(offset=0, sizes=[60, 24], strides=[24, 1]), ("host", "gpu"))
    split = dm2.split(host=("dp", "pp"), gpu=("tp",), pp=4)
    assert (split.names, split.processes.sizes) == (("dp", "pp", "tp"), [15, 4, 24])
    assert dm2.flatten("gpu").processes.strides == [1]
    with pytest.raises(ValueError, match="cannot flatten sparse mesh"):
        DeviceMesh(client, NDSlice(offset=0, sizes=[100], strides=[2]), ("d",)).flatten("x")
    with pytest.raises(NotImplementedError, match="no processes to run tensor programs"):
        dm.activate()
    client.shutdown()
    assert ctrl.exited and isinstance(ctrl.sent[-1][1], messages.Exit)
    client.shutdown()  # idempotent
    assert len(ctrl.sent) == 1


def test_a_client_carries_messages_and_names_what_it_lacks() -> None:
    ctrl = MockController(4, verbose=False)
    client = Client(ctrl, 4, 2)
    assert client.all_ranks == NDSlice(offset=0, sizes=[4], strides=[1])
    assert [client.new_ref(), client.new_ref()] == [0, 1]
    group = messages.CommandGroup([messages.DeleteRefs([1]), messages.BorrowDrop(3)])
    client.send(client.all_ranks, group)
    client.handle_deletes(client.all_ranks, [5])
    assert [m for _, m in ctrl.sent] == [
        messages.DeleteRefs([1]),
        messages.BorrowDrop(3),
        messages.DeleteRefs([5]),
    ]
    assert ctrl.next_message(1.0) is None
    with pytest.raises(RuntimeError, match="exited is not True"):
        ctrl.drain_and_stop()
    with pytest.raises(AttributeError, match=r"Client.fetch: .*controller protocol"):
        client.fetch  # noqa: B018
    client.shutdown()
    with pytest.raises(RuntimeError, match="shut down; DeleteRefs was not sent"):
        client.send(client.all_ranks, messages.DeleteRefs([9]))
    with pytest.raises(ValueError, match="world_size must be an int >= 1"):
        Client(ctrl, 0, 1)


def test_the_runtime_estimator_prices_messages_as_monarchs() -> None:
    runtime = RuntimeEstimator()
    send = messages.SendTensor(None, [1], [2], None, None, None, None)
    local = messages.SendTensor(None, [1], [1], None, None, None, None)
    reduce = messages.Reduce(None, None, None, None, None, (), "sum", False, False, None)
    call = messages.CallFunction(1, None, (), None, (), {}, None, None, [])
    assert [runtime.get_runtime(m) for m in (send, local, reduce, call)] == [
        100_000,
        1_000,
        100_000,
        10_000,
    ]
    assert runtime.get_runtime("kernel_launch") == runtime.get_runtime("wait_event") == 500
    runtime.set_custom_timing({TimingType.REDUCE: 2_000, TimingType.WAIT_EVENT: lambda: 9})
    assert (runtime.get_runtime(reduce), runtime.get_runtime("wait_event")) == (2_000, 9)
    with pytest.raises(TypeError, match="REDUCE must be an int"):
        runtime.set_custom_timing({TimingType.REDUCE: "fast"})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="unexpected message"):
        runtime.get_runtime(messages.Exit(True, None))
    with pytest.raises(NotImplementedError, match="costs='measured'"):
        RuntimeProfiler()
