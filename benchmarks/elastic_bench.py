"""Recovery from a lost rank: danaus.elastic beside torchrun's elastic restart.

The job is ``examples/elastic_ddp.py``'s: 4 data-parallel replicas of a small
model, one global batch of 64 samples per step, SGD with momentum, a fixed
seed. Each system runs ``--steps`` steps and one worker (rank 1) is SIGKILLed
while step ``--kill-at`` runs (after step ``kill_at - 1`` completed).

- ``danaus (spares=1)``: ``ElasticMesh(replicas=4, spares=1)``; the step in
  flight is retried at once; the spare copies a survivor's state and joins.
- ``danaus (spares=0)``: no spare: the survivors go on at 3 until a
  replacement proc (a fresh python that imports torch) is up and joins.
- ``torchrun``: ``torchrun --standalone --nproc-per-node 4 --max-restarts 1
  --monitor-interval 0.1`` on this file's ``--torchrun-worker`` mode (the
  same model, data and update, with ``all_reduce`` of the gradients), rank 0
  saving a checkpoint every ``--every`` steps. A lost worker makes torchrun
  stop the others and start all four again; they load the last checkpoint and
  redo the steps after it.

Measured (wall clock, one machine):

- recovery: from the kill to the next step completed at full size (4);
- steps lost: steps completed before the kill and done again after it;
- healthy idle: from the kill until the healthy ranks complete a step again,
  less one ordinary step (what they would have spent anyway); for torchrun the
  redone steps count too, since they make no progress.

Run: ``python benchmarks/elastic_bench.py [--rounds 3]``; prints a Markdown table.
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import os
import queue
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

PID = re.compile(r"PID (\d+) (\d+)")
STEP = re.compile(r"STEP (\d+) world=")
STEP_WORLD = re.compile(r"STEP (\d+) world=(\d+)")
REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "elastic_ddp.py"


def load_example() -> Any:
    """``examples/elastic_ddp.py`` as module ``elastic_ddp``, importable in the procs too
    (they find it on the ``PYTHONPATH`` they inherit)."""
    path = str(EXAMPLE.parent)
    if path not in sys.path:
        sys.path.insert(0, path)
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (path, os.environ.get("PYTHONPATH", "")) if p
        )
    return importlib.import_module("elastic_ddp")


# -- danaus ------------------------------------------------------------------------------


def run_danaus(steps: int, kill_at: int, spares: int) -> dict[str, Any]:
    from danaus.elastic import ElasticMesh

    ex = load_example()
    mesh = ElasticMesh(ex.Trainer, replicas=4, spares=spares, timeout=60.0)
    done: list[tuple[int, int, float, float]] = []  # (step, world, start, end)
    t_kill = 0.0
    try:
        for k in range(steps):
            start = time.time()
            if k == kill_at:
                # Kill rank 1 mid-step: once this step's call is on its way.
                pid = mesh.pids[1]

                def kill(pid: int = pid) -> None:
                    nonlocal t_kill
                    time.sleep(0.002)
                    t_kill = time.time()
                    os.kill(pid, signal.SIGKILL)

                killer = threading.Thread(target=kill)
                killer.start()
            world, _ = mesh.step(k)
            done.append((k, world, start, time.time()))
            if k == kill_at:
                killer.join()
        # Without a spare, the replacement may join after the last step: go on (the
        # same batches again) until it has, so that its recovery is measured too.
        k = steps
        deadline = time.time() + 300
        while done[-1][1] < 4 and time.time() < deadline:
            start = time.time()
            world, _ = mesh.step(k)
            done.append((k, world, start, time.time()))
            k += 1
        digests = mesh.call("digest")
        stats = mesh.stats()
    finally:
        mesh.stop()
    normal = statistics.median(end - start for k, _, start, end in done if k < kill_at)
    lost_at, full_at = stats.recoveries[0] if stats.recoveries else (t_kill, None)
    after = [(k, w, end) for k, w, _, end in done if end > lost_at]
    return {
        "recovery_s": (full_at - t_kill) if full_at is not None else float("nan"),
        "detect_s": lost_at - t_kill,
        "steps_lost": stats.lost_steps,
        "idle_s": max(0.0, after[0][2] - t_kill - normal) if after else float("nan"),
        "step_s": normal,
        "equal": len(set(digests)) == 1 and len(digests) == 4,
        "restarts": stats.restarts,
        "min_world": min(w for _, w, _, _ in done),
    }


# -- torchrun ----------------------------------------------------------------------------


def torchrun_worker(steps: int, every: int, ckpt_dir: str) -> None:
    """One rank of the torchrun job (started by torchrun, which sets RANK etc.)."""
    import torch
    import torch.distributed as dist

    ex = load_example()
    # A key prefix per restart: with torchrun's shared store, a restarted group that
    # read the keys of the group before it would dial the dead ranks' old ports
    # (seen here with torch 2.13: "connectFullMesh failed ... Connection refused").
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=False
    )
    dist.init_process_group(
        "gloo", store=dist.PrefixStore(f"bench/attempt{attempt}/", store), rank=rank,
        world_size=world,
    )  # fmt: skip
    print(f"PID {rank} {os.getpid()}", flush=True)
    torch.manual_seed(ex.SEED)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=0.05, momentum=0.9)
    for p in params:
        opt.state[p]["momentum_buffer"] = torch.zeros_like(p)
    state = [*params, *(opt.state[p]["momentum_buffer"] for p in params)]
    path = Path(ckpt_dir) / "ckpt.pt"
    first = 0
    if path.exists():
        saved = torch.load(path)
        with torch.no_grad():
            for t, s in zip(state, saved["state"], strict=True):
                t.copy_(s)
        first = saved["step"] + 1
    for k in range(first, steps):
        x, y = ex.batch(k)
        mine = list(range(rank, ex.BATCH, world))
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x[mine]), y[mine], reduction="sum") / ex.BATCH
        loss.backward()
        flat = torch.cat([*(p.grad.reshape(-1) for p in params), loss.detach().reshape(1)])
        dist.all_reduce(flat)
        offset = 0
        with torch.no_grad():
            for p in params:
                p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
                offset += p.numel()
        opt.step()
        if rank == 0:
            print(f"STEP {k} world={world} loss={float(flat[-1]):.6f}", flush=True)
            if (k + 1) % every == 0:
                tmp = path.with_suffix(".tmp")
                torch.save({"step": k, "state": [t.detach().clone() for t in state]}, tmp)
                os.replace(tmp, path)
    dist.barrier()
    dist.destroy_process_group()


def run_torchrun(steps: int, kill_at: int, every: int, tmp: Path) -> dict[str, Any]:
    ckpt = tmp / "torchrun-ckpt"
    ckpt.mkdir(parents=True, exist_ok=True)
    for f in ckpt.iterdir():
        f.unlink()
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
        "--max-restarts", "1", "--monitor-interval", "0.1",
        __file__, "--torchrun-worker", "--steps", str(steps), "--every", str(every),
        "--ckpt", str(ckpt),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    lines: queue.Queue[tuple[float, str] | None] = queue.Queue()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env
    )

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put((time.time(), line.strip()))
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    pids: dict[int, int] = {}
    timeline: list[tuple[float, str]] = []
    t_kill = 0.0
    while (item := lines.get(timeout=600)) is not None:
        _, line = item
        timeline.append(item)
        if (m := PID.search(line)) and not t_kill:
            pids[int(m[1])] = int(m[2])
        elif (m := STEP.search(line)) and int(m[1]) == kill_at - 1 and not t_kill:
            time.sleep(0.002)  # into step kill_at, as for danaus
            t_kill = time.time()
            os.kill(pids[1], signal.SIGKILL)
    proc.wait(timeout=600)
    steps_seen = [(t, int(m[1])) for t, line in timeline if (m := STEP.search(line))]
    before = [(t, k) for t, k in steps_seen if t <= t_kill]
    restarted = next(t for t, line in timeline if t > t_kill and PID.search(line))
    after = [(t, k) for t, k in steps_seen if t > restarted]
    last_before = before[-1][1]
    normal = statistics.median(b[0] - a[0] for a, b in itertools.pairwise(before))
    progress = next(t for t, k in after if k > last_before)
    return {
        "recovery_s": after[0][0] - t_kill,
        "detect_s": float("nan"),
        "steps_lost": last_before + 1 - after[0][1],
        "idle_s": max(0.0, progress - t_kill - normal),
        "step_s": normal,
        "equal": True,  # one process group, restarted from one checkpoint
        "restarts": 1,
        "min_world": 4,
        "returncode": proc.returncode,
    }


# -- torchft -----------------------------------------------------------------------------


def torchft_worker(replica: int, lighthouse: str, steps: int) -> None:
    """One replica group (of one process) of the torchft job."""
    from datetime import timedelta

    import torch
    from torchft import Manager, ProcessGroupGloo

    ex = load_example()
    torch.manual_seed(ex.SEED)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=0.05, momentum=0.9)
    for p in params:
        opt.state[p]["momentum_buffer"] = torch.zeros_like(p)
    state = [*params, *(opt.state[p]["momentum_buffer"] for p in params)]

    def load_state_dict(sd: Any) -> None:
        with torch.no_grad():
            for t, s in zip(state, sd["state"], strict=True):
                t.copy_(s)

    store = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    manager = Manager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=10)),
        min_replica_size=1,
        load_state_dict=load_state_dict,
        state_dict=lambda: {"state": [t.detach().clone() for t in state]},
        replica_id=f"replica{replica}",
        lighthouse_addr=lighthouse,
        store_addr="127.0.0.1",
        store_port=store.port,
        rank=0,
        world_size=1,
        timeout=timedelta(seconds=10),
        quorum_timeout=timedelta(seconds=60),
    )
    print(f"PID {replica} {os.getpid()}", flush=True)
    go = Path(os.environ["ELASTIC_BENCH_GO"])
    while not go.exists():  # all four start together (the lighthouse forms a quorum of 3+)
        time.sleep(0.01)
    while manager.current_step() < steps:
        opt.zero_grad()
        manager.start_quorum()
        n, r = manager.num_participants(), manager.participating_rank()
        k = manager.current_step()
        x, y = ex.batch(k)
        mine = list(range(r or 0, ex.BATCH, n))
        loss = torch.nn.functional.mse_loss(model(x[mine]), y[mine], reduction="sum") / ex.BATCH
        loss.backward()
        flat = torch.cat([*(p.grad.reshape(-1) for p in params), loss.detach().reshape(1)])
        manager.allreduce(flat, reduce_op=torch.distributed.ReduceOp.SUM).wait()
        offset = 0
        with torch.no_grad():
            for p in params:
                p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
                offset += p.numel()
        if manager.should_commit():
            opt.step()
            if r == 0:
                print(f"STEP {k} world={n} loss={float(flat[-1]):.6f}", flush=True)
    manager.shutdown()


def run_torchft(steps: int, kill_at: int) -> dict[str, Any]:
    """4 replica groups and a lighthouse; the killed one is started again at once."""
    from torchft.coordination import LighthouseServer

    lighthouse = LighthouseServer(
        bind="[::]:0", min_replicas=3, join_timeout_ms=1000, heartbeat_timeout_ms=1000
    )
    go = Path(os.environ.get("TMPDIR", "/tmp")) / f"elastic-bench-go-{os.getpid()}"
    go.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "ELASTIC_BENCH_GO": str(go)}
    lines: queue.Queue[tuple[float, str]] = queue.Queue()

    def start(replica: int) -> subprocess.Popen[str]:
        cmd = [sys.executable, __file__, "--torchft-worker", str(replica), "--lighthouse",
               lighthouse.address(), "--steps", str(steps)]  # fmt: skip
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env
        )

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.put((time.time(), line.strip()))

        threading.Thread(target=read, daemon=True).start()
        return proc

    procs = [start(i) for i in range(4)]
    pids: dict[int, int] = {}
    timeline: list[tuple[float, str]] = []
    t_kill = 0.0
    deadline = time.time() + 600
    try:
        while time.time() < deadline:
            try:
                t, line = lines.get(timeout=1)
            except queue.Empty:
                if all(p.poll() is not None for p in procs):
                    break
                continue
            timeline.append((t, line))
            if m := PID.search(line):
                pids[int(m[1])] = int(m[2])
                if len(pids) == 4:
                    go.touch()
            elif (m := STEP.search(line)) and int(m[1]) == kill_at - 1 and not t_kill:
                time.sleep(0.002)
                t_kill = time.time()
                os.kill(pids[1], signal.SIGKILL)
                procs[1].wait()
                procs[1] = start(1)  # as a restarting launcher would, at once
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        lighthouse.shutdown()
        go.unlink(missing_ok=True)
    steps_seen = [
        (t, int(m[1]), int(m[2])) for t, line in timeline if (m := STEP_WORLD.search(line))
    ]
    before = [s for s in steps_seen if s[0] <= t_kill]
    after = [s for s in steps_seen if s[0] > t_kill]
    full = next((t for t, _, w in after if w == 4), float("nan"))
    normal = statistics.median(b[0] - a[0] for a, b in itertools.pairwise(before))
    first_after = min((k for _, k, _ in after), default=before[-1][1] + 1)
    return {
        "recovery_s": full - t_kill,
        "detect_s": float("nan"),
        "steps_lost": max(0, before[-1][1] + 1 - first_after),
        "idle_s": max(0.0, after[0][0] - t_kill - normal) if after else float("nan"),
        "step_s": normal,
        "equal": True,
        "restarts": 1,
        "min_world": min(w for _, _, w in steps_seen),
    }


# -- driver ------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--kill-at", type=int, default=25)
    parser.add_argument("--every", type=int, default=10, help="torchrun: checkpoint period")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--systems", default="danaus1,danaus0,torchrun")
    parser.add_argument("--torchrun-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--ckpt", default="", help=argparse.SUPPRESS)
    parser.add_argument("--torchft-worker", type=int, default=-1, help=argparse.SUPPRESS)
    parser.add_argument("--lighthouse", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.torchrun_worker:
        torchrun_worker(args.steps, args.every, args.ckpt)
        return
    if args.torchft_worker >= 0:
        torchft_worker(args.torchft_worker, args.lighthouse, args.steps)
        return

    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"elastic-bench-{os.getpid()}"
    runs: dict[str, list[dict[str, Any]]] = {}
    names = {
        "danaus1": "danaus.elastic, spares=1",
        "danaus0": "danaus.elastic, spares=0",
        "torchrun": f"torchrun --max-restarts 1, checkpoint every {args.every}",
        "torchft": "torchft 0.2.0 (lighthouse, 4 replica groups, the lost one restarted)",
    }
    for r in range(args.rounds):
        for system in args.systems.split(","):
            if system == "torchrun":
                res = run_torchrun(args.steps, args.kill_at, args.every, tmp)
            elif system == "torchft":
                res = run_torchft(args.steps, args.kill_at)
            else:
                res = run_danaus(args.steps, args.kill_at, int(system[-1]))
            runs.setdefault(system, []).append(res)
            print(f"round {r} {system}: {res}", file=sys.stderr, flush=True)

    def med(system: str, key: str) -> float:
        return statistics.median(float(x[key]) for x in runs[system])

    load = os.getloadavg()[0]
    print(
        f"\n{args.steps} steps, rank 1 SIGKILLed during step {args.kill_at}; medians of "
        f"{args.rounds} round(s); load average at the end {load:.1f} (2 cores)\n"
    )
    print("| system | recovery (s) | steps lost | healthy idle (s) | ordinary step (s) |")
    print("|---|---|---|---|---|")
    for system in runs:
        print(
            f"| {names[system]} | {med(system, 'recovery_s'):.3f} | "
            f"{med(system, 'steps_lost'):.0f} | {med(system, 'idle_s'):.3f} | "
            f"{med(system, 'step_s'):.3f} |"
        )
    if "danaus1" in runs and "torchrun" in runs:
        ratio = med("danaus1", "recovery_s") / med("torchrun", "recovery_s")
        print(f"\nrecovery, danaus (spares=1) / torchrun: {ratio:.3f}x (goal <= 0.2x)")


if __name__ == "__main__":
    main()
