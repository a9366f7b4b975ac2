"""GPU activity and data-plane transfers in the telemetry (issue 41, part 5), without a GPU.

The device queries are faked (``gpu._cuda``: a fake ``torch.cuda`` whose events
complete when the test says and measure what the test's clock says), so the
recording, the reading of completed events, the ``gpus`` table, the ``metrics``
rows and the Prometheus series are exercised here with the code a GPU runs; and
the same code with the real ``torch.cuda`` on this CPU machine answers no devices.
"""

from __future__ import annotations

import concurrent.futures
import re
import sys
from typing import Any

import pytest

from danaus._actor.core import gpu
from danaus._observe import prom, tables
from danaus._observe.tables import COLUMNS, Snapshot
from danaus._runtime.messaging.metrics import Observing
from danaus._wire.ids import ProcId


class FakeEvent:
    """A CUDA timing event: stamped with the fake GPU's clock when it runs."""

    def __init__(self, gpu_: FakeCuda, enable_timing: bool = False) -> None:
        assert enable_timing, "timing events must be asked for"
        self.gpu = gpu_
        self.at: float | None = None

    def record(self) -> None:
        self.gpu.recorded.append(self)
        self.at = None

    def query(self) -> bool:
        return self.at is not None

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.at is not None and end.at is not None
        return end.at - self.at  # milliseconds, as CUDA's


class FakeCuda:
    """``torch.cuda`` as far as danaus asks it: devices, memory, events."""

    def __init__(self, n: int, memory: dict[int, tuple[int, int, int]]) -> None:
        self.n = n
        self.memory = memory  # index -> (allocated, reserved, peak)
        self.recorded: list[FakeEvent] = []
        self.clock_ms = 0.0

    def Event(self, enable_timing: bool = False) -> FakeEvent:  # torch's name
        return FakeEvent(self, enable_timing)

    def run(self, ms: float) -> None:
        """The GPU runs what was recorded, ``ms`` per event pair's work."""
        for ev in self.recorded:
            if ev.at is None:
                ev.at = self.clock_ms
                self.clock_ms += ms / 2
        self.recorded.clear()

    def is_initialized(self) -> bool:
        return True

    def device_count(self) -> int:
        return self.n

    def get_device_name(self, i: int) -> str:
        return f"Fake GPU {i}"

    def memory_allocated(self, i: int) -> int:
        return self.memory.get(i, (0, 0, 0))[0]

    def memory_reserved(self, i: int) -> int:
        return self.memory.get(i, (0, 0, 0))[1]

    def max_memory_allocated(self, i: int) -> int:
        return self.memory.get(i, (0, 0, 0))[2]


class FakeRuntime:
    def __init__(self) -> None:
        self.observing = Observing(True, 100, 1000)


@pytest.fixture(autouse=True)
def clean() -> Any:
    gpu.reset()
    yield
    gpu.reset()


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeCuda:
    cuda = FakeCuda(3, {1: (1000, 4096, 3000)})
    monkeypatch.setattr(gpu, "_cuda", lambda: cuda)
    return cuda


def _run_ops(cuda: FakeCuda, kinds: list[str], device: int, out: Any = None) -> None:
    for i, kind in enumerate(kinds):
        start = gpu.op_started(cuda)
        gpu.op_ended(cuda, start, device, kind, f"aten::op{i}", 10**9 * (i + 1), out)


def test_cpu_here_answers_no_devices_and_zero_transfers() -> None:
    assert gpu._cuda() is None or not gpu._cuda().is_initialized()
    assert gpu.observe() == {
        "devices": [],
        "transfers": {"count": 0, "bytes": 0, "seconds": 0.0, "errors": 0},
    }


def test_observing_never_imports_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert gpu.observe()["devices"] == []
    assert "torch" not in sys.modules


def test_completed_ops_count_their_gpu_time_per_kind_and_device(fake: FakeCuda) -> None:
    _run_ops(fake, ["kernel", "kernel", "copy"], device=1)
    # Nothing ran yet: nothing is counted, and the device shows its memory only.
    (d,) = gpu.observe()["devices"]
    assert (d["kernels"], d["copies"]) == (0, 0)
    fake.run(ms=4.0)  # each op took 2 ms of GPU time (half of each pair's 4)
    (d,) = gpu.observe()["devices"]
    assert d["device"] == "cuda:1" and d["name"] == "Fake GPU 1"
    assert (d["allocated"], d["reserved"], d["peak"]) == (1000, 4096, 3000)
    assert d["kernels"] == 2 and d["kernel_s"] == pytest.approx(2 * 0.002)
    assert d["copies"] == 1 and d["copy_s"] == pytest.approx(0.002)
    # Read once: the next answer does not count them again.
    (again,) = gpu.observe()["devices"]
    assert again["kernels"] == 2


def test_an_op_on_a_device_without_memory_still_gets_its_row(fake: FakeCuda) -> None:
    _run_ops(fake, ["kernel"], device=2)
    fake.run(ms=2.0)
    got = {d["device"]: d for d in gpu.observe()["devices"]}
    assert set(got) == {"cuda:1", "cuda:2"}  # cuda:0: never used, no row
    assert got["cuda:2"]["kernels"] == 1 and got["cuda:2"]["reserved"] == 0


def test_reading_stops_at_an_op_still_running(fake: FakeCuda) -> None:
    _run_ops(fake, ["kernel"], device=1)
    fake.run(ms=2.0)
    _run_ops(fake, ["copy"], device=1)  # queued after, not run yet
    (d,) = gpu.observe()["devices"]
    assert (d["kernels"], d["copies"]) == (1, 0)
    fake.run(ms=2.0)
    (d,) = gpu.observe()["devices"]
    assert (d["kernels"], d["copies"]) == (1, 1)


def test_timed_ops_are_spans_in_the_ring_at_most_spans_per_s(
    fake: FakeCuda, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gpu, "SPANS_PER_S", 3)
    rt = FakeRuntime()
    out = gpu.sink(rt, "tensor[0]", {"mesh": "tensor", "rank": 0})
    for _ in range(5):  # five ops queued in the same second
        start = gpu.op_started(fake)
        gpu.op_ended(fake, start, 1, gpu.KERNEL, "aten::mm", 7 * 10**9, out)
    fake.run(ms=6.0)
    (d,) = gpu.observe()["devices"]
    assert d["kernels"] == 5  # counted, every one
    spans = rt.observing.recent.copy()["spans"]
    assert len(spans) == 3
    name, t0, t1, actor, trace_id, _, _, attrs = spans[0]
    assert name == "cuda.kernel" and actor == "tensor[0]" and trace_id is None
    assert t0 == 7 * 10**9 and t1 - t0 == 3_000_000  # the GPU's 3 ms from the queue time
    assert attrs == {"mesh": "tensor", "rank": 0, "kind": "gpu", "op": "aten::mm",
                     "device": "cuda:1"}  # fmt: skip


def test_many_pending_ops_are_read_without_an_answer(fake: FakeCuda) -> None:
    _run_ops(fake, ["kernel"] * (gpu._MAX_PENDING - 1), device=1)
    fake.run(ms=2.0)
    assert gpu._ops == {}  # read only when the pending ones fill up, or at an answer
    _run_ops(fake, ["kernel"], device=1)
    assert gpu._ops[1][0] == gpu._MAX_PENDING - 1  # the last is still running
    assert len(gpu._free) == 2 * (gpu._MAX_PENDING - 1)  # their events are reused
    _run_ops(fake, ["kernel"], device=1)
    assert len(gpu._free) == 2 * (gpu._MAX_PENDING - 1) - 2


def test_transfers_are_counted_when_they_end() -> None:
    ok: concurrent.futures.Future[None] = concurrent.futures.Future()
    bad: concurrent.futures.Future[None] = concurrent.futures.Future()
    gpu.transfer_started(ok, 4096)
    gpu.transfer_started(bad, 100)
    assert gpu.transfers()["count"] == 0  # under way
    ok.set_result(None)
    bad.set_exception(TimeoutError("late"))
    t = gpu.transfers()
    assert (t["count"], t["bytes"], t["errors"]) == (2, 4196, 1)
    assert t["seconds"] > 0


def test_the_tensor_engine_times_only_gpu_commands_on_a_cuda_worker(fake: FakeCuda) -> None:
    torch = pytest.importorskip("torch")
    from danaus._tensor import gpu_timing
    from danaus._tensor.messages import CallOp, Delete, SendTo

    ran: list[Any] = []
    one = ran.append
    assert gpu_timing.timed(one, torch.device("cpu")) is one  # nothing added
    run = gpu_timing.timed(one, torch.device("cuda", 1))
    run(CallOp("aten::mm.default", (), {}, (1,), (), False))
    run(CallOp("aten::_to_copy.default", (), {}, (2,), (), False))
    run(SendTo(1, 3, ((0, 1),), (2,), None))
    run(Delete((1,)))  # bookkeeping: not timed
    assert len(ran) == 4
    fake.run(ms=2.0)
    (d,) = gpu.observe()["devices"]
    assert (d["kernels"], d["copies"]) == (1, 2)


def _entry(name: str, section: Any) -> dict[str, Any]:
    sections = {} if section is None else {"gpu": section}
    answer = {"host": "h1", "time": 5.0, "proc": name, "client": False, "actors": [],
              "connections": [], "sections": sections}  # fmt: skip
    return {"id": ProcId(name, "host:h1"), "answer": (True, answer), "lost": None}


def _snapshot(fake: FakeCuda) -> Snapshot:
    _run_ops(fake, ["kernel", "copy"], device=1)
    fake.run(ms=8.0)
    moved: concurrent.futures.Future[None] = concurrent.futures.Future()
    gpu.transfer_started(moved, 512)
    moved.set_result(None)
    return Snapshot([_entry("gpu0", gpu.observe()), _entry("old", None)], {})


def test_the_gpus_table_and_the_transfer_metrics(fake: FakeCuda) -> None:
    snap = _snapshot(fake)
    (row,) = tables._gpus(snap)
    got = dict(zip([c for c, _, _ in COLUMNS["gpus"]], row, strict=True))
    assert got["proc"] == "gpu0" and got["device"] == "cuda:1"
    assert got["memory_reserved_bytes"] == 4096 and got["kernels"] == 1
    assert got["kernel_s"] == pytest.approx(0.004) and got["copy_s"] == pytest.approx(0.004)
    metrics = {(r[1], r[7]): r[8] for r in tables._metrics(snap)}
    assert metrics[("gpu0", "transfers")] == 1 and metrics[("gpu0", "transfer_bytes")] == 512
    assert metrics[("gpu0", "transfer_errors")] == 0
    assert ("old", "transfers") not in metrics  # a proc that answers no section: no rows


def test_prometheus_series_of_gpus_and_transfers(
    fake: FakeCuda, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("prometheus_client")
    snap = _snapshot(fake)
    monkeypatch.setattr(prom, "gather", lambda node, rings=False: snap)
    text = prom.exposition().decode()

    def value(name: str, **labels: str) -> float:
        want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))  # as it writes them
        m = re.search(rf"^{name}\{{{re.escape(want)}\}} (\S+)$", text, re.M)
        assert m, f"no {name}{{{want}}} in the exposition"
        return float(m.group(1))

    dev = {"proc": "gpu0", "host": "h1", "device": "cuda:1"}
    assert value("danaus_gpu_memory_reserved_bytes", **dev) == 4096
    assert value("danaus_gpu_kernels_total", **dev) == 1
    assert value("danaus_gpu_kernel_seconds_total", **dev) == pytest.approx(0.004)
    assert value("danaus_gpu_copies_total", **dev) == 1
    assert value("danaus_proc_transfers_total", proc="gpu0", host="h1") == 1
    assert value("danaus_proc_transfer_bytes_total", proc="gpu0", host="h1") == 512


def test_prometheus_has_no_gpu_series_without_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("prometheus_client")
    snap = Snapshot([_entry("cpu0", gpu.observe())], {})
    monkeypatch.setattr(prom, "gather", lambda node, rings=False: snap)
    text = prom.exposition().decode()
    assert not re.search(r"^danaus_gpu_\w+\{", text, re.M)
    assert 'danaus_proc_transfers_total{host="h1",proc="cpu0"} 0.0' in text
