"""Plan a training step before getting the machines: simulate it on 2 hosts x 4 GPUs.

A two-layer model trained data-parallel: forward, backward written out as
matmuls, the gradients all-reduced on a side stream while the next layer's
backward runs, then an SGD update. No GPU is needed: ``danaus.Simulator``
gives a mesh whose workers are simulated. The program prints the simulated
step time, each stream's busy time, and the peak GPU memory, and can plot
the memory over time (``--plot FILE``, needs matplotlib).

    python examples/simulate_training.py [--plot memory.png] [--trace DIR]
"""

from __future__ import annotations

import argparse
import os
import tempfile
from typing import Any

import torch

import danaus
from danaus import Stream


def train_step(mesh: Any, batch: int = 512, dim: int = 2048) -> None:
    comms = Stream("comms")
    with mesh.activate():
        w1 = torch.randn(dim, dim, device="cuda")
        w2 = torch.randn(dim, dim, device="cuda")
        x = torch.randn(batch, dim, device="cuda")
        with danaus.set_meta("forward"):
            h = torch.relu(x @ w1)
            y = h @ w2
        with danaus.set_meta("backward"):
            dy = torch.ones_like(y)
            g2 = h.t() @ dy
            g2_c, borrow2 = comms.borrow(g2, mutable=True)
            with comms.activate():
                g2_c.reduce_(("host", "gpu"), reduction="avg")  # overlaps the next matmuls
            dh = (dy @ w2.t()) * (h > 0)
            g1 = x.t() @ dh
            del dh
            g1_c, borrow1 = comms.borrow(g1, mutable=True)
            with comms.activate():
                g1_c.reduce_(("host", "gpu"), reduction="avg")
        borrow2.drop()
        borrow1.drop()
        with danaus.set_meta("update"):
            w1.sub_(g1 * 0.01)
            w2.sub_(g2 * 0.01)


def simulate(trace_dir: str) -> Any:
    sim = danaus.Simulator(
        hosts=2, gpus=4, trace_path=os.path.join(trace_dir, "trace.json"), group_workers=True
    )
    train_step(sim.mesh)
    report = sim.report()
    sim.mesh.exit()  # writes trace_0.json: open it in https://ui.perfetto.dev
    return report


def plot(report: Any, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.2))
    for g in report.groups:
        ts = [0.0] + [t * 1e6 for t, _ in g.memory]
        mb = [0.0] + [b / 1e6 for _, b in g.memory]
        ax.step(ts, mb, where="post", label=f"ranks {g.ranks[0]}-{g.ranks[-1]}")
    ax.set_xlabel("simulated time (µs)")
    ax.set_ylabel("GPU memory (MB)")
    ax.set_title("One simulated training step, 2 hosts x 4 GPUs")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--plot", help="write a plot of GPU memory over time here (PNG)")
    ap.add_argument("--trace", help="directory for the trace (default: a temporary one)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        report = simulate(args.trace or tmp)
    print(
        f"simulated step: {report.time * 1e3:.3f} ms, peak GPU memory "
        f"{report.peak_memory / 1e6:.1f} MB, {len(report.groups)} group(s) of ranks"
    )
    for g in report.groups:
        for name, s in g.streams.items():
            print(
                f"  ranks {g.ranks[0]}-{g.ranks[-1]} {name}: busy {s['busy'] * 1e3:.3f} ms, "
                f"ends at {s['end'] * 1e3:.3f} ms"
            )
    if args.plot:
        plot(report, args.plot)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
