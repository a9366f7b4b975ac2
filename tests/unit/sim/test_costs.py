"""Measured op costs (timed here, cached by op, shapes, dtypes and device) and the
communication model's arithmetic."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import danaus  # noqa: E402
from danaus.simulator import MeasuredCosts, NetworkConfig  # noqa: E402
from danaus.simulator.communication_model import (  # noqa: E402
    LinkClass,
    collective_time_s,
    estimate_collective_time_us,
    ring_all_reduce_s,
    send_time_s,
    tensor_size_bytes,
    tree_all_reduce_s,
)
from danaus.simulator.utils import file_path_with_iter  # noqa: E402


def _run(tmp_path: Path, cache: Path, name: str) -> tuple[MeasuredCosts, list[dict[str, Any]]]:
    costs = MeasuredCosts(cache, reps=1)
    sim = danaus.Simulator(1, 2, trace_path=str(tmp_path / f"{name}.json"), costs=costs)
    with sim.mesh.activate():
        a = torch.ones(64, 32, device="cuda")
        b = torch.ones(32, 16, device="cuda")
        c = a @ b
        d = a @ b  # the same op and shapes: measured once
        e = torch.ones(16, 16, device="cuda") @ torch.ones(16, 16, device="cuda")
    sim.mesh.exit()
    trace = json.loads(Path(file_path_with_iter(str(tmp_path / f"{name}.json"), 0)).read_text())
    assert c is not None and d is not None and e is not None
    return costs, trace["traceEvents"]


def test_ops_are_timed_once_cached_by_shape_and_reused(tmp_path: Path) -> None:
    cache = tmp_path / "costs.json"
    first, trace = _run(tmp_path, cache, "first")
    table = json.loads(cache.read_text())["ops"]
    mm = [k for k in table if k.startswith("aten::mm|")]
    assert len(mm) == 2  # (64x32 @ 32x16) and (16x16 @ 16x16), each once
    assert any("T(64,32;float32)" in k and "T(32,16;float32)" in k for k in mm)
    assert all(k.endswith("|cpu") for k in table)  # measured on this machine's CPU
    assert first.measured == len(table)
    # the trace's durations are the cached measurements
    key = next(k for k in mm if "T(64,32;float32)" in k)
    durs = [
        e["dur"]
        for e in trace
        if e.get("cat") == "compute" and e["pid"] == 1 and e["name"] == "aten.mm"
    ]
    assert durs[0] == pytest.approx(table[key] * 1e6, abs=1e-3)
    assert durs[0] == durs[1]
    second, trace2 = _run(tmp_path, cache, "second")
    assert second.measured == 0  # everything came from the file
    durs2 = [
        e["dur"]
        for e in trace2
        if e.get("cat") == "compute" and e["pid"] == 1 and e["name"] == "aten.mm"
    ]
    assert durs2 == durs


def test_an_unreadable_cache_is_ignored_with_a_warning(tmp_path: Path, caplog: Any) -> None:
    cache = tmp_path / "costs.json"
    cache.write_text("{not json")
    with caplog.at_level("WARNING", logger="danaus.simulator"):
        costs = MeasuredCosts(cache)
    assert costs.table == {}
    assert "unreadable op-cost cache" in caplog.text


def test_ring_and_tree_all_reduce_follow_their_formulas() -> None:
    link = LinkClass(bandwidth=10e9, latency=5e-6)
    n, nbytes = 8, 64 << 20
    assert ring_all_reduce_s(nbytes, n, link) == pytest.approx(2 * 7 * (5e-6 + nbytes / (8 * 10e9)))
    assert tree_all_reduce_s(nbytes, n, link) == pytest.approx(2 * 3 * 5e-6 + 2 * nbytes / 10e9)
    # large buffers favour the ring, tiny ones the tree; "auto" takes the faster
    small = 1024
    assert tree_all_reduce_s(small, 64, link) < ring_all_reduce_s(small, 64, link)
    assert ring_all_reduce_s(nbytes, n, link) < tree_all_reduce_s(nbytes, n, link)
    for size in (small, nbytes):
        assert collective_time_s("all_reduce", size, n, link) == min(
            ring_all_reduce_s(size, n, link), tree_all_reduce_s(size, n, link)
        )
    assert collective_time_s("all_reduce", nbytes, 1, link) == 0.0
    assert send_time_s(nbytes, link) == pytest.approx(5e-6 + nbytes / 10e9)


def test_link_classes_price_groups_that_span_hosts_higher() -> None:
    net = NetworkConfig(gpus_per_node=4)
    assert net.link_for([0, 1, 2, 3]) == net.link("intra")
    assert net.link_for([3, 4]) == net.link("inter")
    assert estimate_collective_time_us("all_reduce", [1024, 1024], "float32", 8, net) > (
        estimate_collective_time_us("all_reduce", [1024, 1024], "float32", 4, net)
    )
    assert tensor_size_bytes([3, 3], "bfloat16") == 18
    assert tensor_size_bytes([2], torch.float64) == 16
    with pytest.raises(ValueError, match="algorithm"):
        NetworkConfig(algorithm="butterfly")
    with pytest.raises(ValueError, match="bandwidth must be > 0"):
        NetworkConfig(inter_node_bandwidth_gbs=0)


def test_measured_collectives_use_the_network_model(tmp_path: Path) -> None:
    net = NetworkConfig(gpus_per_node=2, algorithm="ring")
    costs = MeasuredCosts(tmp_path / "c.json", network=net, reps=1)
    sim = danaus.Simulator(2, 2, trace_path=str(tmp_path / "t.json"), costs=costs)
    with sim.mesh.activate():
        t = torch.ones(1 << 16, device="cuda")  # 256 KiB
        t.reduce_("gpu")  # within a host: the intra link
        t.reduce_("host")  # across hosts: the inter link
    sim.mesh.exit()
    trace = json.loads(Path(file_path_with_iter(str(tmp_path / "t.json"), 0)).read_text())[
        "traceEvents"
    ]
    durs = [e["dur"] for e in trace if e.get("name") == "reduce_scatter" and e["pid"] == 1]
    nbytes = 1 << 18
    intra = ring_all_reduce_s(nbytes, 2, net.link("intra")) * 1e6
    inter = ring_all_reduce_s(nbytes, 2, net.link("inter")) * 1e6
    # each starts when the stream is free, so its span is at least its cost
    assert durs[0] == pytest.approx(intra, abs=1e-3)  # to the nanosecond
    assert durs[1] == pytest.approx(inter, abs=1e-3)
    assert math.isfinite(durs[0])


def test_ranks_beyond_a_hosts_cores_share_its_bandwidth() -> None:
    net = NetworkConfig(
        intra_node_bandwidth_gbs=2.0, intra_node_latency_us=0, gpus_per_node=64, host_cores=2
    )
    two, four = net.link_for(range(2)), net.link_for(range(4))
    assert two.bandwidth == 2e9  # one core each
    assert four.bandwidth == 1e9  # four ranks on two cores: half each
    # so a 4-rank ring all-reduce takes (2*3/4) / (2*1/2) * 2 = 3x the 2-rank one
    nbytes = 32 << 20
    assert ring_all_reduce_s(nbytes, 4, four) == pytest.approx(
        3 * ring_all_reduce_s(nbytes, 2, two)
    )
    assert NetworkConfig(single_hop_latency_us=3.0).link("inter").latency == pytest.approx(3e-6)
