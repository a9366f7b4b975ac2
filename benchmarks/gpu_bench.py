"""GPU data plane: RDMABuffer on CUDA memory against the device's own copies (issue 38).

Measured on one GPU, each figure the median of ``--repeat`` timed runs after a
warm-up, in GB/s (10^9 bytes per second, counting the bytes moved once):

- ``floor_d2d``: ``dst.copy_(src)`` device to device in one process (the physical floor,
  timed with CUDA events); ``floor_d2d_wall``: the same timed on the host from launch to
  ``synchronize()``, as the procs time a transfer.
- ``pinned_h2d``: ``dst.copy_(pinned, non_blocking=True)`` host to device in one process.
- ``ipc``: a proc reads another proc's CUDA buffer into its own CUDA tensor, both procs on
  this GPU (``read_into(...).get()`` timed in the reader: CUDA IPC, device to device).
- ``staged``: a proc reads another proc's *CPU* buffer into its CUDA tensor (the data
  plane's staged path: process_vm into pinned chunks, pipelined with the uploads).
- ``nixl``: as ``ipc`` with the owner's buffer registered with NIXL (``rdma_backend="nixl"``),
  where ``nixl`` imports.
- ``weight_sync``: a trainer proc's model (256 MiB of float32 parameters in all) read by a
  generator proc into its own model with one RDMAAction, against the floor for 256 MiB.

Goals (issue 38): ``ipc`` at 256 MiB >= 0.8 of ``floor_d2d``; ``staged`` >= 0.7 of
``pinned_h2d``. Without CUDA it prints (and writes) ``{"cuda": false, ...}`` and exits 0.

Usage::

    python benchmarks/gpu_bench.py [--sizes 16,256] [--repeat 5] [--json FILE]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from typing import Any

from danaus.actor import Actor, endpoint, this_host
from danaus.config import configure
from danaus.rdma import RDMAAction, RDMABuffer

MiB = 1 << 20
GOAL_IPC = 0.8
GOAL_STAGED = 0.7


def _gbps(nbytes: int, seconds: float) -> float:
    return round(nbytes / seconds / 1e9, 2) if seconds > 0 else float("inf")


def _median(xs: list[float]) -> float:
    return statistics.median(xs)


def _time_cuda(fn: Any, repeat: int) -> float:
    """Median seconds of ``fn()`` (device work), each timed with CUDA events after a warm-up."""
    import torch

    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1000)
    return _median(times)


def local_floors(size: int, repeat: int) -> dict[str, float]:
    import torch

    src = torch.empty(size, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    pinned = torch.empty(size, dtype=torch.uint8, pin_memory=True).random_()
    d2d = _time_cuda(lambda: dst.copy_(src), repeat)
    h2d = _time_cuda(lambda: dst.copy_(pinned, non_blocking=True), repeat)
    walls = []
    for _ in range(repeat):  # as the procs time a transfer: launch to completion, on the host
        t0 = time.perf_counter()
        dst.copy_(src)
        torch.cuda.synchronize()
        walls.append(time.perf_counter() - t0)
    return {
        "floor_d2d": _gbps(size, d2d),
        "floor_d2d_wall": _gbps(size, _median(walls)),
        "pinned_h2d": _gbps(size, h2d),
    }


class Owner(Actor):
    """Owns the registered memory (a proc of this host, on the GPU)."""

    def __init__(self) -> None:
        self.keep: dict[str, Any] = {}

    @endpoint
    def make(self, name: str, size: int, device: str, backend: str = "builtin") -> RDMABuffer:
        import torch

        configure(rdma_backend=backend)  # what moves the buffers registered from here on
        t = torch.empty(size, dtype=torch.uint8, device=device).random_()
        if device == "cuda":
            torch.cuda.synchronize()
        buf = RDMABuffer(t)
        self.keep[name] = (t, buf)
        return buf

    @endpoint
    def model(
        self, total: int, layers: int, device: str, backend: str = "builtin"
    ) -> list[RDMABuffer]:
        """A trainer's model: ``layers`` square linear layers, ``total`` bytes of float32."""
        import torch

        configure(rdma_backend=backend)
        side = int((total // 4 // layers) ** 0.5)
        net = torch.nn.Sequential(
            *[torch.nn.Linear(side, side, bias=False) for _ in range(layers)]
        ).to(device)
        if device == "cuda":
            torch.cuda.synchronize()
        bufs = [RDMABuffer(p.data) for p in net.parameters()]
        self.keep["model"] = (net, bufs)
        return bufs

    @endpoint
    def drop_all(self) -> None:
        for _, held in self.keep.values():
            for buf in held if isinstance(held, list) else [held]:
                buf.drop().get()
        self.keep.clear()


class Reader(Actor):
    """Reads the owner's buffers into its own memory, timing each transfer."""

    @endpoint
    def read(self, buf: RDMABuffer, device: str, repeat: int) -> dict[str, Any]:
        import torch

        dst = torch.empty(buf.size(), dtype=torch.uint8, device=device)
        buf.read_into(dst).get()  # warm-up: opens the IPC handle, allocates pinned slots
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            buf.read_into(dst).get()
            times.append(time.perf_counter() - t0)
        return {"seconds": _median(times), "backend": buf.backend}

    @endpoint
    def sync(self, bufs: list[RDMABuffer], repeat: int, device: str) -> dict[str, Any]:
        """A generator's weight sync: every parameter read in one RDMAAction."""
        import torch

        sides = [int((b.size() // 4) ** 0.5) for b in bufs]
        net = torch.nn.Sequential(*[torch.nn.Linear(s, s, bias=False) for s in sides]).to(device)
        params = list(net.parameters())
        action = RDMAAction()
        for p, b in zip(params, bufs, strict=True):
            action.read_into(b, p.data)
        action.submit().get()
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            action.submit().get()
            times.append(time.perf_counter() - t0)
        nbytes = sum(p.numel() * p.element_size() for p in params)
        return {"seconds": _median(times), "bytes": nbytes}


def mesh_figures(
    sizes: list[int], repeat: int, with_nixl: bool, device: str = "cuda", model: int = 256 * MiB
) -> dict[str, Any]:
    """The figures that need two procs. ``device="cpu"`` runs the same flow on host memory
    (``--cpu-smoke``: the harness itself checked on a machine without a GPU)."""
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    out: dict[str, Any] = {}
    try:
        owner = procs.slice(gpus=0).spawn("bench_owner", Owner)
        reader = procs.slice(gpus=1).spawn("bench_reader", Reader)
        for size in sizes:
            row: dict[str, Any] = {}
            gpu_buf = owner.make.call_one(f"g{size}", size, device).get()
            r = reader.read.call_one(gpu_buf, device, repeat).get()
            row["ipc"] = _gbps(size, r["seconds"])
            row["ipc_backend"] = r["backend"]
            cpu_buf = owner.make.call_one(f"c{size}", size, "cpu").get()
            r = reader.read.call_one(cpu_buf, device, repeat).get()
            row["staged"] = _gbps(size, r["seconds"])
            if with_nixl:  # the same read, the owner's buffer registered with NIXL
                nixl_buf = owner.make.call_one(f"n{size}", size, device, "nixl").get()
                r = reader.read.call_one(nixl_buf, device, repeat).get()
                row["nixl"] = _gbps(size, r["seconds"])
                row["nixl_backend"] = r["backend"]
            owner.drop_all.call_one().get()
            out[str(size // MiB)] = row
        layers = 16
        bufs = owner.model.call_one(model, layers, device).get()
        r = reader.sync.call_one(bufs, repeat, device).get()
        out["weight_sync"] = {"bytes": r["bytes"], "gbps": _gbps(r["bytes"], r["seconds"])}
        out["weight_sync"]["seconds"] = round(r["seconds"], 6)
        if with_nixl:
            owner.drop_all.call_one().get()
            bufs = owner.model.call_one(model, layers, device, "nixl").get()
            r = reader.sync.call_one(bufs, repeat, device).get()
            out["weight_sync_nixl"] = {"bytes": r["bytes"], "gbps": _gbps(r["bytes"], r["seconds"])}
    finally:
        procs.stop().get()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="16,256", help="MiB, comma-separated")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", help="also write the result to this file")
    ap.add_argument(
        "--cpu-smoke",
        action="store_true",
        help="run the two-proc flow on host memory, tiny sizes (checks the harness without a GPU)",
    )
    args = ap.parse_args(argv)
    sizes = [int(s) * MiB for s in args.sizes.split(",") if s]
    result: dict[str, Any] = {"bench": "gpu_bench", "sizes_mib": [s // MiB for s in sizes]}
    if args.cpu_smoke:
        result.update(cuda=False, smoke=True)
        nixl = importlib.util.find_spec("nixl") is not None
        result["figures"] = mesh_figures(sizes, 1, nixl, device="cpu", model=4 * MiB)
        return _finish(result, args.json)
    try:
        import torch
    except ImportError:
        torch = None  # type: ignore[assignment]
    if torch is None or not torch.cuda.is_available():
        why = "torch is not installed" if torch is None else "torch sees no GPU"
        result.update(cuda=False, skipped=f"CUDA is absent: {why}")
        return _finish(result, args.json)
    result.update(cuda=True, device=torch.cuda.get_device_name(), torch=torch.__version__)
    figures: dict[str, Any] = {str(s // MiB): local_floors(s, args.repeat) for s in sizes}
    nixl = importlib.util.find_spec("nixl") is not None
    try:
        mesh = mesh_figures(sizes, args.repeat, nixl)
    except Exception as e:  # report what was measured and why the rest was not
        mesh = {"error": f"{type(e).__name__}: {e}"}
    if not nixl:
        mesh["nixl"] = {"skipped": "nixl is not importable"}
    for key, row in mesh.items():
        if key in figures and isinstance(row, dict):
            figures[key].update(row)
        else:
            figures[key] = row
    result["figures"] = figures
    result["goals"] = goals(figures, sizes)
    return _finish(result, args.json)


def goals(figures: dict[str, Any], sizes: list[int]) -> dict[str, Any]:
    """The issue's ratios at the largest size measured, and whether each is met."""
    key = str(max(sizes) // MiB)
    row = figures.get(key, {})
    out: dict[str, Any] = {}
    if "ipc" in row:
        ratio = round(row["ipc"] / row["floor_d2d"], 3)
        out["ipc_vs_d2d"] = {"ratio": ratio, "goal": GOAL_IPC, "met": ratio >= GOAL_IPC}
        out["ipc_vs_d2d_wall"] = {"ratio": round(row["ipc"] / row["floor_d2d_wall"], 3)}
    if "staged" in row:
        ratio = round(row["staged"] / row["pinned_h2d"], 3)
        out["staged_vs_h2d"] = {"ratio": ratio, "goal": GOAL_STAGED, "met": ratio >= GOAL_STAGED}
    if "nixl" in row:
        ratio = round(row["nixl"] / row["floor_d2d"], 3)
        out["nixl_vs_d2d"] = {"ratio": ratio, "goal": GOAL_IPC, "met": ratio >= GOAL_IPC}
    sync = figures.get("weight_sync")
    floor = figures.get("256", {}).get("floor_d2d")
    if isinstance(sync, dict) and "gbps" in sync and floor:
        out["weight_sync_vs_d2d"] = {"ratio": round(sync["gbps"] / floor, 3)}
    return out


def _finish(result: dict[str, Any], path: str | None) -> int:
    text = json.dumps(result, sort_keys=True)
    if path:
        with open(path, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
