"""GPU activity and data-plane transfers in the telemetry of a real job (issue 41, part 5).

On CPU procs the same code answers: the ``gpus`` table exists with its columns and
no rows, no ``danaus_gpu_*`` series, and the transfers a proc made are counted. The
tests marked ``gpu`` check real values on a GPU (skipped, saying why, without CUDA).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from danaus import telemetry
from danaus._observe import prom
from danaus._observe.tables import COLUMNS
from danaus.actor import Actor, ProcMesh, endpoint, this_host
from danaus.rdma import RDMABuffer

from .conftest import REPLY_TIMEOUT, proc_names

NBYTES = 4096


class Reader(Actor):
    @endpoint
    def read(self, buf: RDMABuffer) -> int:
        dst = bytearray(buf.size())
        buf.read_into(dst).get(timeout=REPLY_TIMEOUT)
        return sum(dst)


def test_a_cpu_job_has_an_empty_gpus_table_and_counts_its_transfers(procs: ProcMesh) -> None:
    readers = procs.spawn("readers", Reader)
    buf = RDMABuffer(bytearray(b"\x02" * NBYTES))
    assert readers.slice(gpus=1).read.call_one(buf).get(timeout=REPLY_TIMEOUT) == 2 * NBYTES
    names = proc_names(procs)

    described = telemetry.query("DESCRIBE gpus")
    assert [r["column_name"] for r in described] == [c for c, _, _ in COLUMNS["gpus"]]
    assert telemetry.query("SELECT count(*) AS n FROM gpus") == [{"n": 0}]

    rows = telemetry.query(
        "SELECT proc, name, value FROM metrics WHERE name LIKE 'transfer%' ORDER BY proc, name"
    )
    by = {(r["proc"], r["name"]): r["value"] for r in rows}
    assert by[(names[1], "transfers")] == 1
    assert by[(names[1], "transfer_bytes")] == NBYTES
    assert by[(names[1], "transfer_errors")] == 0
    assert by[(names[1], "transfer_s")] > 0
    assert by[(names[0], "transfers")] == 0 and by[(names[0], "transfer_s")] == 0
    # the client's own proc answers too (it made no transfer)
    assert {p for p, _ in by} > set(names)


def test_a_cpu_job_exports_transfers_and_no_gpu_series(procs: ProcMesh) -> None:
    pytest.importorskip("prometheus_client")
    readers = procs.spawn("readers2", Reader)
    buf = RDMABuffer(bytearray(b"\x01" * NBYTES))
    before = _series(prom.exposition().decode(), "danaus_proc_transfer_bytes_total")
    readers.slice(gpus=0).read.call_one(buf).get(timeout=REPLY_TIMEOUT)
    text = prom.exposition().decode()
    after = _series(text, "danaus_proc_transfer_bytes_total")
    name = proc_names(procs)[0]
    assert after[name] - before.get(name, 0.0) == NBYTES
    assert not re.search(r"^danaus_gpu_\w+\{", text, re.M)
    assert "# TYPE danaus_gpu_kernel_seconds_total counter" in text  # declared, no samples


def _series(text: str, metric: str) -> dict[str, float]:
    return {
        m.group(1): float(m.group(2))
        for m in re.finditer(rf'^{metric}\{{host="[^"]*",proc="([^"]+)"\}} (\S+)$', text, re.M)
    }


# -- on a GPU --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cuda_procs() -> Iterator[ProcMesh]:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA: this machine has no GPU torch can use")
    import danaus.config

    with danaus.config.configured(tensor_device="cuda"):
        pm = this_host().spawn_procs(per_host={"gpus": 1})
        pm.initialized.get(timeout=REPLY_TIMEOUT)
        yield pm
        pm.stop().get(timeout=REPLY_TIMEOUT)


@pytest.mark.gpu
@pytest.mark.torch
def test_a_gpu_worker_reports_its_kernels_copies_and_memory(cuda_procs: ProcMesh) -> None:
    import torch

    import danaus

    with cuda_procs.activate():
        x = torch.ones(512, 512)
        y = x @ x  # a kernel
        z = y.to(torch.float16)  # a copy (aten::_to_copy)
        assert danaus.inspect(z).cpu().float().sum().item() == 512.0**3
    name = proc_names(cuda_procs)[0]
    rows = telemetry.query(f"SELECT * FROM gpus WHERE proc = '{name}'")
    assert len(rows) == 1, rows
    (g,) = rows
    assert g["device"].startswith("cuda:") and g["device_name"]
    assert g["memory_allocated_bytes"] >= 3 * 512 * 512 * 2  # x, y (fp32) and z (fp16) live
    assert g["memory_peak_bytes"] >= g["memory_allocated_bytes"]
    assert g["memory_reserved_bytes"] >= g["memory_allocated_bytes"]
    assert g["kernels"] >= 1 and g["kernel_s"] > 0
    assert g["copies"] >= 1 and g["copy_s"] > 0
    spans = telemetry.query(
        f"SELECT name, attributes FROM spans WHERE proc = '{name}' AND name LIKE 'cuda.%'"
    )
    assert {s["name"] for s in spans} >= {"cuda.kernel", "cuda.copy"}
    text = prom.exposition().decode()
    assert re.search(
        rf'^danaus_gpu_kernels_total\{{device="cuda:\d+",host="[^"]*",proc="{name}"\}} [1-9]',
        text,
        re.M,
    )
