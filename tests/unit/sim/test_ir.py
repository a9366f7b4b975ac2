"""``danaus.simulator.ir``: timing keys of a command graph and their timings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from danaus.simulator.communication_model import (  # noqa: E402
    NetworkConfig,
    estimate_collective_time_us,
    estimate_send_time_us,
)
from danaus.simulator.ir import IRGraph  # noqa: E402


def _graph() -> IRGraph:
    g = IRGraph()
    g.insert_node(0, "main", 1, "CallFunction: aten.mm", [0], [], [])
    g.update_tensor(10, 100, torch.float32, (8, 4), 0, "main", 0)  # made earlier
    g.update_tensor(11, 101, torch.float32, (4, 2), 0, "main", 0)
    g.update_tensor(10, 100, torch.float32, (8, 4), 0, "main", 1)  # read by the mm
    g.update_tensor(11, 101, torch.float32, (4, 2), 0, "main", 1)
    g.insert_node(1, "main", 1, "CallFunction: aten.mm", [1], [], [])  # the same op elsewhere
    g.insert_node(0, "main", 2, "Reduce: all_reduce: 3", [0, 1, 2, 3], [1], [])
    g.update_tensor(12, 102, torch.bfloat16, (1024,), 0, "main", 2)
    g.insert_node(0, "main", 3, "SendTensor: 7", [0, 1], [2], [])
    g.insert_node(0, "main", 4, "BorrowCreate: 5", [0], [], [])
    return g


def test_commands_are_catalogued_by_timing_key_and_timed_by_the_models(tmp_path: Path) -> None:
    g = _graph()
    net = NetworkConfig(intra_node_bandwidth_gbs=100.0)
    g.export_command_types(str(tmp_path / "t.json"), include_timing=True, network_config=net)
    data = json.loads((tmp_path / "t.json").read_text())
    keys = {e["timing_key"]: e for e in data["command_types"]}
    assert set(keys) == {
        "CallFunction:aten.mm:(8x4)x(4x2):float32",
        "Reduce:all_reduce:(1024):bfloat16:4",
        "SendTensor:unknown",
        "BorrowCreate",
    }
    assert keys["CallFunction:aten.mm:(8x4)x(4x2):float32"]["count"] == 2
    timing = data["timing"]
    assert timing["Reduce:all_reduce:(1024):bfloat16:4"] == estimate_collective_time_us(
        "all_reduce", [1024], "bfloat16", 4, net
    )
    assert timing["SendTensor:unknown"] == estimate_send_time_us([], "unknown", net) == 0
    assert timing["BorrowCreate"] == 100
    assert timing["CallFunction:aten.mm:(8x4)x(4x2):float32"] >= 1  # measured here, in µs
    # the timings are applied to the commands
    assert [c.duration for c in g.control_dag] == [
        timing["CallFunction:aten.mm:(8x4)x(4x2):float32"],
        timing["CallFunction:aten.mm:(8x4)x(4x2):float32"],
        timing["Reduce:all_reduce:(1024):bfloat16:4"],
        0,
        100,
    ]
