"""danaus.timer on a mesh: each worker times its own work (the timer itself, in this
process: tests/unit/tensor/test_timer.py).

No test compares a time with a threshold.
"""

from __future__ import annotations

import pytest

import danaus
from danaus.actor import ProcMesh

from .conftest import COORDS, torch

pytestmark = pytest.mark.torch

# -- on the mesh: each worker times its own work -------------------------------------------

PATH = "danaus.timer.remote_execution_timer"


def test_a_remote_start_and_stop_measure_on_every_worker(mesh: ProcMesh) -> None:
    from . import helpers

    reset = danaus.remote(helpers.reset_execution_timer, propagate="inspect")
    start = danaus.remote(f"{PATH}.execution_timer_start", propagate="inspect")
    stop = danaus.remote(f"{PATH}.execution_timer_stop", propagate="inspect")
    latest = danaus.remote(
        f"{PATH}.get_latest_timer_measurement",
        propagate=lambda name=None: torch.tensor(0.0, dtype=torch.float64),
    )
    summary = danaus.remote(f"{PATH}.get_execution_timer_summary", propagate="inspect")
    with mesh.activate():
        reset()
        assert start("mesh-section", use_cpu=True) is None  # propagate="inspect": no results
        x = torch.ones(4) * 2
        stop("mesh-section", use_cpu=True)
        measured = latest("mesh-section")
        stats = summary.call().get(timeout=30)
        missing = latest("never-started")
    assert isinstance(measured, danaus.Tensor)
    for h, g in COORDS:
        value = danaus.inspect(measured, host=h, gpu=g)
        assert value.dtype == torch.float64 and value.item() >= 0.0
        assert danaus.inspect(missing, host=h, gpu=g).item() == 0.0
    assert torch.equal(danaus.inspect(x), torch.full((4,), 2.0))
    assert len(list(stats.items())) == len(COORDS)
    for _, s in stats.items():
        assert list(s) == ["mesh-section"] and s["mesh-section"]["count"] == 1


def test_monarchs_timer_example_runs_on_cpu(mesh: ProcMesh) -> None:
    """The flow of Monarch's python/monarch/timer/example_monarch.py, tensors on the CPU."""
    from . import helpers

    execution_timer_start = danaus.remote(f"{PATH}.execution_timer_start", propagate="inspect")
    execution_timer_stop = danaus.remote(f"{PATH}.execution_timer_stop", propagate="inspect")
    get_execution_timer_average_ms = danaus.remote(
        f"{PATH}.get_execution_timer_average_ms",
        propagate=lambda: torch.tensor(0.0, dtype=torch.float64),
    )
    get_time_perfcounter = danaus.remote(
        f"{PATH}.get_time_perfcounter",
        propagate=lambda: torch.tensor(0.0, dtype=torch.float64),
    )
    reset = danaus.remote(helpers.reset_execution_timer, propagate="inspect")
    count = danaus.remote(f"{PATH}.get_execution_timer_summary", propagate="inspect")
    one = mesh.slice(host=0, gpu=0)
    with one.activate():
        reset()
        num_iterations = 5
        a = torch.randn(100, 100, device="cpu")
        b = torch.randn(100, 100, device="cpu")
        torch.matmul(a, b)
        total_dt = torch.zeros(1, dtype=torch.float64)
        for _ in range(num_iterations):
            t0 = get_time_perfcounter()
            torch.matmul(a, b)
            total_dt += get_time_perfcounter() - t0
        for _ in range(num_iterations):
            execution_timer_start()
            torch.matmul(a, b)
            execution_timer_stop()
        cuda_average_ms = get_execution_timer_average_ms()
        local_total_dt = danaus.inspect(total_dt).item()
        local_cuda_avg_ms = danaus.inspect(cuda_average_ms).item()
        stats = count.call_one().get(timeout=30)
    assert local_total_dt > 0.0  # perf_counter only moves forward
    assert local_cuda_avg_ms >= 0.0
    assert stats["default"]["count"] == num_iterations
    assert stats["default"]["mean_ms"] == pytest.approx(local_cuda_avg_ms)
