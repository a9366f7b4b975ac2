"""danaus.Simulator: streams, memory, collectives, grouping, fetches, remote functions, CPU ops.

Costs come from ``FixedCosts(compute=C, collective=K)`` so that every
expected time is the model's arithmetic on the program's commands.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import danaus  # noqa: E402
from danaus import Stream, fetch_shard  # noqa: E402
from danaus.simulator import FixedCosts, SimulatorTraceMode  # noqa: E402
from danaus.simulator.utils import file_path_with_iter  # noqa: E402

C = 7e-6  # seconds an op
K = 50e-6  # seconds a collective
US = 1e6


def _sim(tmp_path: Path, hosts: int = 1, gpus: int = 2, **kw: Any) -> Any:
    return danaus.Simulator(
        hosts,
        gpus,
        trace_path=str(tmp_path / "trace.json"),
        costs=FixedCosts(compute=C, collective=K),
        **kw,
    )


def _trace(tmp_path: Path, it: int = 0) -> list[dict[str, Any]]:
    path = file_path_with_iter(str(tmp_path / "trace.json"), it)
    return json.loads(Path(path).read_text())["traceEvents"]  # type: ignore[no-any-return]


def _threads(trace: list[dict[str, Any]], pid: int) -> dict[str, list[tuple[str, float, float]]]:
    names = {
        e["tid"]: e["args"]["name"] for e in trace if e["name"] == "thread_name" and e["pid"] == pid
    }
    out: dict[str, list[tuple[str, float, float]]] = {n: [] for n in names.values()}
    for e in trace:
        if e["pid"] == pid and e.get("cat") == "compute":
            out[names[e["tid"]]].append((e["name"], e["ts"], e["ts"] + e["dur"]))
    return out


def _memory(trace: list[dict[str, Any]], pid: int, cat: str = "memory") -> list[float]:
    return [e["args"]["allocated"] for e in trace if e["pid"] == pid and e.get("cat") == cat]


def test_streams_borrows_and_memory_follow_the_program(tmp_path: Path) -> None:
    sim = _sim(tmp_path, trace_mode="stream_only")
    mesh = sim.mesh
    other = Stream("other")
    with mesh.activate():
        x = torch.randn(100, 100, device="cuda")  # 40 kB
        y = torch.mm(x, x)
        b, borrow = other.borrow(y, mutable=True)
        with other.activate():
            b.reduce_("gpu", reduction="sum")
        borrow.drop()
        z = x.view(10000)  # a view: no task, no memory
        del x
        w = torch.randn(10, device="cuda")  # the deletion of x is simulated before this
    mesh.exit()
    threads = _threads(_trace(tmp_path), 1)
    c, k = C * US, K * US
    main = threads["main"]
    assert [n for n, _, _ in main] == ["aten.randn", "aten.mm", "waiting for other", "aten.randn"]
    assert main[1][1:] == pytest.approx((c, 2 * c))
    # the borrow waits for mm (2c), the collective takes k, and main waits for the drop
    assert threads["other"][0] == ("waiting for main", 0.0, pytest.approx(2 * c))
    assert threads["other"][1][0] == "reduce_scatter"  # Monarch's name for a plain all-reduce
    assert threads["other"][1][1:] == pytest.approx((2 * c, 2 * c + k))
    assert main[2][1:] == pytest.approx((2 * c, 2 * c + k))
    assert main[3][1:] == pytest.approx((2 * c + k, 3 * c + k))
    # x and y 40 kB each; x's storage outlives x through its view z
    assert _memory(_trace(tmp_path), 1) == pytest.approx([0.04, 0.08, 0.08004])
    assert z is not None and w is not None


def _controller(tmp_path: Path, it: int = 0) -> list[str]:
    return [n for n, _, _ in _threads(_trace(tmp_path, it), 0)["Controller"]]


def test_the_controller_trace_lists_monarchs_messages_for_a_borrow(tmp_path: Path) -> None:
    # the program of Monarch's test_borrow; the names are what Monarch 0.7.0's simulator
    # writes for it (its client: in-place results named anew, deletions batched before the
    # next message, BorrowFirstUse at the first use, RequestStatus and Exit at exit)
    sim = _sim(tmp_path, trace_mode="everything")
    other = Stream("other")
    with sim.mesh.activate():
        a = torch.randn(100, 100, device="cuda")
        b = torch.mm(a, a)
        c = torch.nn.init.uniform_(b)
        bc, borrow = other.borrow(c, mutable=True)
        with other.activate():
            bc.add_(bc)
        borrow.drop()
    sim.mesh.exit()
    assert _controller(tmp_path) == [
        "aten.randn",
        "aten.mm",
        "aten.uniform_",
        "DeleteRefs",  # uniform_'s result
        "BorrowCreate",
        "BorrowFirstUse",
        "aten.add_.Tensor",
        "DeleteRefs",  # add_'s result
        "BorrowLastUse",  # drop() deletes the borrowed tensor: its last use
        "DeleteRefs",
        "BorrowDrop",
        "RequestStatus",
        "Exit",
    ]
    assert _memory(_trace(tmp_path), 1) == pytest.approx([0.04, 0.08])


def test_borrowed_views_fetches_and_collectives_in_the_controller_trace(tmp_path: Path) -> None:
    sim = _sim(tmp_path, trace_mode="everything")
    other = Stream("other")
    with sim.mesh.activate():
        x = torch.randn(8, device="cuda")  # 32 bytes
        bx, borrow = other.borrow(x)
        with other.activate():
            v = bx.view(2, 4)  # a view of the borrowed tensor: x's storage, no memory
            u = v + 1
            del v, bx, u  # the borrow's last tensor goes: BorrowLastUse before the drop
        z = torch.randn(4, device="cuda")
        borrow.drop()
        z.reduce_("gpu")
        fetch_shard(z).result()
    sim.mesh.exit()
    assert _controller(tmp_path) == [
        "aten.randn",
        "BorrowCreate",
        "BorrowFirstUse",
        "aten.view",
        "aten.add.Tensor",
        "DeleteRefs",
        "BorrowLastUse",
        "DeleteRefs",
        "aten.randn",
        "BorrowDrop",
        "Reduce",
        "SendValue",
        "RequestStatus",
        "Exit",  # the fetch's RequestStatus was answered: none at exit
    ]
    # x; u (32 bytes: the view costs none) at c on "other"; z at c on main; u freed when
    # "other" has run its add (2c)
    assert _memory(_trace(tmp_path), 1) == pytest.approx([32e-6, 64e-6, 80e-6, 48e-6])
    assert borrow.tensor is None  # a dropped borrow holds no tensor


def test_a_tensor_deleted_after_its_borrow_is_dropped_frees_its_memory(tmp_path: Path) -> None:
    # Monarch's test_reduce_with_stream_trace_only: the dropped borrow must not keep
    # the borrowed buffer alive, so deleting its last views frees it at once
    sim = _sim(tmp_path, trace_mode="stream_only")
    reducer = Stream("reducer")
    with sim.mesh.activate():
        x = torch.randn(100, 100, device="cuda")
        y = torch.randn(100, 100, device="cuda")
        flat = torch.cat((x.view(10000), y.view(10000)))  # 80 kB
        fb, borrow = reducer.borrow(flat)
        with reducer.activate():
            fb.reduce_("gpu", reduction="avg")
        borrow.drop()
        a, b = flat.split((10000, 10000))
        del flat
        n1 = torch.randn(100, 100, device="cuda")  # sends the deletion of flat: a, b hold it
        del a, b
        n2 = torch.randn(100, 100, device="cuda")  # sends theirs: the buffer goes before it
    sim.mesh.exit()
    assert _memory(_trace(tmp_path), 1) == pytest.approx([0.04, 0.08, 0.16, 0.2, 0.12, 0.16])
    assert fb is not None and n1 is not None and n2 is not None


def test_a_collective_starts_when_the_slowest_member_reaches_it(tmp_path: Path) -> None:
    sim = _sim(tmp_path, hosts=1, gpus=4)
    mesh = sim.mesh
    with mesh.activate():
        t = torch.ones(8, device="cuda")
    with mesh.slice(gpu=slice(0, 2)).activate():  # ranks 0 and 1 do three more ops
        a = torch.ones(8, device="cuda")
        a = a + 1
        a = a * 2
    with mesh.activate():
        t.reduce_("gpu")
    report = sim.report()
    mesh.exit()
    ends = {tuple(g.ranks): g.streams["main"]["end"] for g in report.groups}
    assert ends == {
        (0,): pytest.approx(4 * C + K),
        (1,): pytest.approx(4 * C + K),
        (2,): pytest.approx(4 * C + K),
        (3,): pytest.approx(4 * C + K),
    }
    threads = _threads(_trace(tmp_path), 3 + 2)  # rank 2: pids 1 (tid 2) and 3 (tid 4) before
    assert threads["main"][-1] == (
        "reduce_scatter",
        pytest.approx(C * US),
        pytest.approx((4 * C + K) * US),
    )
    assert a is not None


def _program(mesh: Any) -> None:
    """Three behaviours: hosts 0-1 run a long stage, host 2 a short one, the rest idle;
    then every rank joins an all-reduce over its host's GPUs and one over hosts."""
    hosts = mesh._shape.extent.sizes[0]
    with mesh.activate():
        t = torch.ones(1024, device="cuda")
    with mesh.slice(host=slice(0, 2)).activate():
        a = torch.ones(64, 64, device="cuda")
        for _ in range(3):
            a = a @ a
    with mesh.slice(host=2).activate():
        b = torch.ones(64, device="cuda") + 1
    with mesh.activate():
        t.reduce_("gpu")
        t.reduce_("host")
        t = t * 2
    del a, b, hosts


def test_grouped_workers_simulate_the_same_times_as_one_per_rank(tmp_path: Path) -> None:
    reports = []
    for group in (False, True):
        sim = _sim(tmp_path / str(group), hosts=4, gpus=2, group_workers=group)
        _program(sim.mesh)
        reports.append(sim.report())
        sim.mesh.exit()
    per_rank = [
        {r: (g.streams, g.peak_memory) for g in rep.groups for r in g.ranks} for rep in reports
    ]
    assert per_rank[0] == per_rank[1]
    assert len(reports[0].groups) == 8
    assert len(reports[1].groups) == 3  # hosts 0-1, host 2, host 3
    assert reports[0].time == pytest.approx(reports[1].time)


def test_grouping_splits_as_monarch_does() -> None:
    from danaus import NDSlice
    from danaus.simulator.simulator import Simulator

    sim = Simulator(world_size=16, group_workers=True)
    groups = list(sim._ndslice_to_worker_group([NDSlice(offset=4, sizes=[8], strides=[1])]))
    assert [list(g.workers) for g in groups] == [list(range(4, 12))]
    assert [list(g.workers) for g in sim._worker_groups] == [
        list(range(4, 12)),
        [0, 1, 2, 3, 12, 13, 14, 15],
    ]
    # a slice that covers whole groups splits nothing
    list(sim._ndslice_to_worker_group([NDSlice(offset=0, sizes=[16], strides=[1])]))
    assert len(sim._worker_groups) == 2


def test_fetch_shard_returns_zeros_and_the_controller_waits_for_it(tmp_path: Path) -> None:
    sim = _sim(tmp_path)
    mesh = sim.mesh
    with mesh.activate():
        x = torch.ones(3, 4, device="cuda")
        x = x + 1
        got = fetch_shard(x, gpu=1).result()
        torch.ones(2, device="cuda")  # issued after the fetch: on rank 0 it waits too
    mesh.exit()
    assert torch.equal(got, torch.zeros(3, 4))
    threads = _threads(_trace(tmp_path), 3)  # rank 1
    assert [n for n, _, _ in threads["main"]] == [
        "aten.ones",
        "aten.add.Tensor",
        "fetch_shard",
        "aten.ones",
    ]
    fetch_end = threads["main"][2][2]
    rank0 = _threads(_trace(tmp_path), 1)["main"]
    assert rank0[-1][1] == pytest.approx(fetch_end)  # rank 0 was idle since 2C


@danaus.remote(propagate=lambda x: x.clone())
def _scale(x: Any) -> Any:
    return x * 3


@danaus.remote(propagate=lambda x, group: x.add_(1))
def _all_reduce(x: Any, group: Any = None) -> Any:
    torch.distributed.all_reduce(x, group=group)
    return x


def test_remote_functions_are_tasks_and_a_group_synchronises_them(tmp_path: Path) -> None:
    sim = _sim(tmp_path, hosts=1, gpus=2)
    mesh = sim.mesh
    with mesh.activate():
        pg = mesh.process_group(("gpu",))
        x = torch.ones(4, device="cuda")
    with mesh.slice(gpu=0).activate():
        y = torch.ones(4, device="cuda") * 2  # rank 0 is behind by C
    with mesh.activate():
        z = _scale(x)
        _all_reduce(x, group=pg)
    mesh.exit()
    r0 = _threads(_trace(tmp_path), 1)["main"]
    r1 = _threads(_trace(tmp_path), 3)["main"]
    assert [n for n, _, _ in r1][-2:] == ["_scale", "_all_reduce"]
    # _scale runs when each is free; the group's function ends together on both
    assert r1[-1][2] == pytest.approx(r0[-1][2])
    assert r0[-1][2] == pytest.approx((4 * C + C + K) * US)  # 4 ops, then its own C and K
    assert y is not None and z is not None


def test_cpu_tensors_count_as_host_memory(tmp_path: Path) -> None:
    sim = _sim(tmp_path)
    with sim.mesh.activate():
        g = torch.ones(1000, device="cuda")  # 4 kB of GPU memory
        h = torch.ones(2000, device="cpu")  # 8 kB of host memory: an optimizer offload
        h.mul_(2)
    report = sim.report()
    sim.mesh.exit()
    assert report.groups[0].peak_memory == 4000
    assert report.groups[0].peak_host_memory == 8000
    trace = _trace(tmp_path)
    assert _memory(trace, 1) == [0.004]
    assert _memory(trace, 1, "host_memory") == [0.008]
    assert "aten.mul_.Tensor" in [n for n, _, _ in _threads(trace, 1)["main"]]
    assert g is not None


def test_steps_write_one_trace_each_and_report_time_and_memory(tmp_path: Path) -> None:
    sim = _sim(tmp_path, trace_mode=SimulatorTraceMode.EVERYTHING)
    with sim.mesh.activate():
        x = torch.ones(250, device="cuda")
    t0, m0 = sim.step()
    with sim.mesh.activate():
        y = x + 1
    t1, m1 = sim.step()
    sim.mesh.exit()
    assert (t0, m0) == (pytest.approx(C), pytest.approx(0.001))
    assert (t1, m1) == (pytest.approx(2 * C), pytest.approx(0.002))
    controller = _threads(_trace(tmp_path, 1), 0)["Controller"]
    assert [n for n, _, _ in controller] == ["aten.ones", "aten.add.Tensor"]
    assert Path(file_path_with_iter(str(tmp_path / "trace.json"), 2)).exists()  # exit's
    assert y is not None


def test_bad_arguments_and_uses_say_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="hosts must be an int >= 1"):
        danaus.Simulator(0, 2)
    with pytest.raises(ValueError, match="trace_mode='loud' is not one of"):
        danaus.Simulator(1, 2, trace_mode="loud")
    with pytest.raises(ValueError, match="costs must be"):
        danaus.Simulator(1, 2, costs="guess")
    with pytest.raises(NotImplementedError, match="command history"):
        danaus.Simulator(1, 2, simulate_mode="command_history")
    sim = _sim(tmp_path)
    with pytest.raises(NotImplementedError, match="no procs to spawn actors"):
        sim.mesh.spawn("a", object)
    sim.mesh.exit()
    with pytest.raises(RuntimeError, match="has exited"), sim.mesh.activate():
        torch.ones(2, device="cuda")


def test_4096_ranks_in_three_behaviours_are_simulated_as_three_groups(tmp_path: Path) -> None:
    sim = _sim(tmp_path, hosts=512, gpus=8, group_workers=True)
    mesh = sim.mesh
    layers = {(0, 128): 2, (128, 320): 4, (320, 512): 6}
    with mesh.activate():
        loss = torch.zeros(1, device="cuda")
    for (a, b), n in layers.items():
        with mesh.slice(host=slice(a, b)).activate():
            w = torch.ones(64, 64, device="cuda")
            for _ in range(n):
                w = w @ w
            w.reduce_("gpu")
    with mesh.activate():
        loss.reduce_(("host", "gpu"))
    report = sim.report()
    mesh.exit()
    assert [(g.ranks[0], len(g.ranks)) for g in report.groups] == [
        (0, 1024),
        (1024, 1536),
        (2560, 1536),
    ]
    # each stage's work: zeros (1 op), then ones + n matmuls, one collective, the loss's
    busy = [g.streams["main"]["busy"] for g in report.groups]
    assert busy == [pytest.approx((2 + n) * C + 2 * K) for n in layers.values()]
    # the global all-reduce waits for the slowest stage, so every rank ends together
    ends = [g.streams["main"]["end"] for g in report.groups]
    assert ends == [pytest.approx(report.time)] * 3
    assert report.time == pytest.approx(8 * C + 2 * K)  # the 6-layer stage, then the loss


def test_set_meta_labels_the_tasks_in_the_trace(tmp_path: Path) -> None:
    sim = _sim(tmp_path)
    with sim.mesh.activate():
        with danaus.set_meta("forward"):
            x = torch.ones(4, device="cuda")
        y = x + 1
    sim.mesh.exit()
    names = [n for n, _, _ in _threads(_trace(tmp_path), 1)["main"]]
    assert names == ["aten.ones forward", "aten.add.Tensor"]
    assert y is not None


def test_a_backward_pass_and_coalescing_are_simulated(tmp_path: Path) -> None:
    sim = _sim(tmp_path)
    act = sim.mesh.activate()  # Monarch's style: activate, then deactivate
    w = torch.randn(4, 4, device="cuda", requires_grad=True)
    loss = (w * w).sum()
    loss.backward()
    with danaus.coalescing():
        g = w.grad * 2
    shape = fetch_shard(g).result().shape
    sim.mesh.deactivate()
    sim.mesh.exit()
    assert shape == (4, 4)
    names = [n for n, _, _ in _threads(_trace(tmp_path), 1)["main"]]
    assert names[:3] == ["aten.randn", "aten.mul.Tensor", "aten.sum"]
    assert "aten.mul.Tensor" in names[3:] and names[-1] == "fetch_shard"  # the backward's
    assert sim._activations == [] and act is not None
