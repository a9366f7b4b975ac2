"""The tensor engine against plain torch on the same processes, as ratios.

    python benchmarks/tensor_bench.py            # full sizes, 3 rounds
    python benchmarks/tensor_bench.py --smoke    # tiny sizes, a few iterations, 1 round
    python benchmarks/tensor_bench.py --json out.json --rounds 5

Three measurements on one ``{"dp": 4}`` proc mesh, each repeated ``--rounds``
times (danaus and its baseline one after the other in every round); the
figures are the medians over rounds, which matters on a shared machine:

- dispatch: small ops issued per second by the client under ``mesh.activate()``
  (until the last result is back), against eager local torch running the same
  ops in the client.
- all-reduce of 1, 16 and 64 MiB of float32: ``t.reduce_("dp")`` issued back
  to back (then a one-element fetch to know they finished), against
  ``torch.distributed.all_reduce`` back to back
  with gloo in the same 4 worker processes (run there with ``danaus.remote``,
  its own process group), as bandwidth (MiB/s of the tensor reduced).
- a DDP training step of ``examples/ddp_cpu.py``'s model: danaus (forward,
  ``grad_generator``, one bucketed ``reduce_(grads, avg)``, SGD as one
  ``_foreach_add_``, as ``SGD(foreach=True)``) against torch's
  ``DistributedDataParallel`` with gloo in the same processes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

import danaus
from danaus.actor import this_host

MiB = 1 << 20


# -- run on the workers (danaus.remote) ------------------------------------------


def torch_allreduce_seconds(rank: Any, port: int, world: int, nbytes: int, iters: int) -> float:
    """Seconds per ``dist.all_reduce`` of ``nbytes`` with gloo, in its own process group."""
    import torch.distributed as dist

    r = int(rank)
    store = dist.TCPStore("127.0.0.1", port, world, is_master=False)
    pg = dist.ProcessGroupGloo(dist.PrefixStore(f"ar{nbytes}", store), r, world)
    t = torch.ones(nbytes // 4)
    opts = dist.AllreduceOptions()
    pg.allreduce([t], opts).wait()  # warm up
    t0 = time.perf_counter()
    for _ in range(iters):
        pg.allreduce([t], opts).wait()
    took = (time.perf_counter() - t0) / iters
    pg.shutdown()
    return took


def torch_ddp_step_seconds(rank: Any, port: int, world: int, steps: int) -> tuple[float, float]:
    """(wall, CPU) seconds per step of torch DDP (gloo) on the ddp_cpu example's model."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    r = int(rank)
    store = dist.TCPStore("127.0.0.1", port, world, is_master=False)
    if not dist.is_initialized():
        dist.init_process_group(
            "gloo", store=dist.PrefixStore("ddp", store), rank=r, world_size=world
        )
    torch.manual_seed(0)
    model = DDP(_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(BATCH, 16), torch.randn(BATCH, 1)
    for _ in range(3):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    dist.barrier()
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    dist.barrier()
    return (time.perf_counter() - t0) / steps, (time.process_time() - c0) / steps


def cpu_seconds() -> float:
    """This worker process's CPU time so far (every thread)."""
    return time.process_time()


BATCH = 8


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))


# -- the client's side -----------------------------------------------------------


def bench_dispatch(mesh: Any, n: int) -> dict[str, float]:
    def ops(x: Any) -> Any:
        for _ in range(n):
            x = x * 1.0001 + 1
        return x

    x0 = torch.ones(4)
    t0 = time.perf_counter()
    ops(x0)
    local = 2 * n / (time.perf_counter() - t0)
    with mesh.activate():
        x = torch.ones(4)
        danaus.inspect(x)
        t0 = time.perf_counter()
        y = ops(x)
        issued = time.perf_counter() - t0
        danaus.inspect(y)
        done = time.perf_counter() - t0
    return {
        "local_ops_per_s": local,
        "danaus_issue_ops_per_s": 2 * n / issued,
        "danaus_ops_per_s": 2 * n / done,
        "ratio": (2 * n / done) / local,
        "issue_ratio": (2 * n / issued) / local,
    }


def bench_allreduce(mesh: Any, sizes: list[int], iters: int) -> list[dict[str, float]]:
    rows = []
    store = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    raw = danaus.remote(torch_allreduce_seconds, propagate=lambda *a: None)
    world = mesh.size("dp")
    for nbytes in sizes:
        with mesh.activate():
            t = torch.ones(nbytes // 4)
            t.reduce_("dp", "sum")
            danaus.inspect(t[:1])  # warm up: group made, pages touched
            # back to back, as the torch loop runs; the client waits once, at the end
            t0 = time.perf_counter()
            for _ in range(iters):
                t.reduce_("dp", "sum")
            danaus.inspect(t[:1])
            ours = (time.perf_counter() - t0) / iters
            rank = mesh.rank("dp")
            per_rank = raw.call(rank, store.port, world, nbytes, iters).get(timeout=600)
        torch_s = max(per_rank.values())
        rows.append(
            {
                "MiB": nbytes / MiB,
                "danaus_MiB_per_s": nbytes / MiB / ours,
                "torch_MiB_per_s": nbytes / MiB / torch_s,
                "ratio": torch_s / ours,
            }
        )
    return rows


def bench_ddp(mesh: Any, steps: int) -> dict[str, float]:
    torch.manual_seed(0)
    with mesh.activate():
        model = _model()
        x, y = torch.randn(BATCH, 16), torch.randn(BATCH, 1)

        def step() -> Any:
            loss = torch.nn.functional.mse_loss(model(x), y)
            params = list(model.parameters())
            grads = danaus.grad_generator(loss, list(reversed(params)))
            with torch.no_grad():
                grads = danaus.reduce_(list(grads), "dp", "avg")  # one bucket, as DDP's
                torch._foreach_add_(list(reversed(params)), grads, alpha=-0.1)  # SGD, foreach
            return loss

        for _ in range(3):
            step()
        danaus.inspect(next(iter(model.parameters()))[:1])
        cpu = danaus.remote(cpu_seconds, propagate=lambda: None)
        w0 = sum(cpu.call().get(timeout=600).values())
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(steps):
            loss = step()
        danaus.inspect(loss)
        ours = (time.perf_counter() - t0) / steps
        client_cpu = (time.process_time() - c0) / steps
        workers_cpu = (sum(cpu.call().get(timeout=600).values()) - w0) / steps
        store = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        raw = danaus.remote(torch_ddp_step_seconds, propagate=lambda *a: None)
        per_rank = raw.call(mesh.rank("dp"), store.port, mesh.size("dp"), steps).get(timeout=600)
    theirs = max(wall for wall, _ in per_rank.values())
    theirs_cpu = sum(c for _, c in per_rank.values())
    return {
        "danaus_step_ms": ours * 1e3,
        "torch_ddp_step_ms": theirs * 1e3,
        "ratio": ours / theirs,
        # CPU seconds per step summed over every process (the client's too): what a
        # shared, oversubscribed machine divides among them, so steadier than wall time
        "danaus_cpu_ms": (client_cpu + workers_cpu) * 1e3,
        "danaus_client_cpu_ms": client_cpu * 1e3,
        "torch_ddp_cpu_ms": theirs_cpu * 1e3,
        "cpu_ratio": (client_cpu + workers_cpu) / theirs_cpu,
    }


def _median(rounds: list[Any]) -> Any:
    """The element-wise median of several rounds' results (dicts, lists and numbers)."""
    first = rounds[0]
    if isinstance(first, dict):
        return {k: _median([r[k] for r in rounds]) for k in first}
    if isinstance(first, list):
        return [_median([r[i] for r in rounds]) for i in range(len(first))]
    if isinstance(first, (int, float)):
        return statistics.median(rounds)
    return first


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, a few iterations")
    ap.add_argument("--rounds", type=int, help="repetitions (default 3, 1 with --smoke)")
    ap.add_argument("--json", help="also write the results here")
    a = ap.parse_args()
    smoke = a.smoke
    rounds = a.rounds or (1 if smoke else 3)
    mesh = this_host().spawn_procs(per_host={"dp": 4})
    samples = []
    try:
        for _ in range(rounds):
            samples.append(
                {
                    "dispatch": bench_dispatch(mesh, 200 if smoke else 5000),
                    "allreduce": bench_allreduce(
                        mesh,
                        [64 << 10, 1 * MiB] if smoke else [1 * MiB, 16 * MiB, 64 * MiB],
                        2 if smoke else 10,
                    ),
                    "ddp": bench_ddp(mesh, 5 if smoke else 50),
                }
            )
    finally:
        mesh.stop().get(timeout=60)
    results = {"mode": "smoke" if smoke else "full", "rounds": rounds, **_median(samples)}
    results["samples"] = samples
    d = results["dispatch"]
    print(f"median of {rounds} round(s)")
    print(
        f"dispatch: danaus {d['danaus_issue_ops_per_s']:.0f} ops/s issued "
        f"({d['danaus_ops_per_s']:.0f} completed), local eager torch "
        f"{d['local_ops_per_s']:.0f} ops/s: ratio issued {d['issue_ratio']:.3f}, "
        f"completed {d['ratio']:.3f}"
    )
    for row in results["allreduce"]:
        print(
            f"all-reduce {row['MiB']:g} MiB over 4 procs: "
            f"danaus {row['danaus_MiB_per_s']:.0f} MiB/s, "
            f"torch.distributed gloo {row['torch_MiB_per_s']:.0f} MiB/s: ratio {row['ratio']:.2f}"
        )
    r = results["ddp"]
    print(
        f"DDP step: danaus {r['danaus_step_ms']:.2f} ms, "
        f"torch DDP {r['torch_ddp_step_ms']:.2f} ms: "
        f"ratio {r['ratio']:.2f}"
    )
    print(
        f"DDP step CPU (all processes): danaus {r['danaus_cpu_ms']:.2f} ms "
        f"(client {r['danaus_client_cpu_ms']:.2f}), torch DDP {r['torch_ddp_cpu_ms']:.2f} ms: "
        f"ratio {r['cpu_ratio']:.2f}"
    )
    worst = min(row["ratio"] for row in results["allreduce"])
    print(
        f"target: all-reduce >= 0.80 of torch's bandwidth: worst {worst:.2f} -> "
        f"{'met' if worst >= 0.8 else 'MISSED'}"
    )
    print(
        f"target: DDP step <= 1.2x torch DDP: {r['ratio']:.2f}x -> "
        f"{'met' if r['ratio'] <= 1.2 else 'MISSED'}"
    )
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
