"""The benchmark workloads: what each one measures, its sizes, and the targets.

Shared by ``run.py`` (the driver) and the per-system workers in ``systems/``.
Standard library only: the workers run under each comparator's own virtual
environment, where nothing from this repository is installed.

Every worker sample is one measured quantity:

* ``latency`` workloads: seconds per operation (lower is better);
* ``rate`` workloads: seconds per batch of ``work`` units (calls, MiB); the
  table shows ``work / seconds`` (higher is better), its "p99" column being
  the rate at the slow-tail (99th percentile) batch time;
* ``size`` workloads: bytes (lower is better).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

MiB = 1 << 20


@dataclass(frozen=True)
class Params:
    """How much to run in one worker process (one round)."""

    warmup: int  # untimed iterations first
    samples: int  # timed iterations at most
    budget_s: float  # stop taking samples after this long (at least one is taken)
    size: int = 0  # workload-specific: calls per batch, bytes per payload, procs
    timeout_s: float = 60.0  # the driver kills the worker after this long
    processes: int = 1  # worker processes per system and round, each a fresh client


@dataclass(frozen=True)
class Workload:
    name: str
    kind: str  # "latency" | "rate" | "size"
    title: str
    full: Params
    smoke: Params
    rate_unit: str = ""  # for kind == "rate": "calls/s" or "MiB/s"
    notes: str = ""
    # The client imports torch before anything else, as a training script does
    # (where the system's interpreter has torch; the worker says if it has not).
    torch: bool = False

    def params(self, smoke: bool) -> Params:
        return self.smoke if smoke else self.full


WORKLOADS: list[Workload] = [
    Workload(
        "spawn",
        "latency",
        "spawn 4 procs x 1 actor, until all answered",
        full=Params(warmup=1, samples=5, budget_s=30, size=4, timeout_s=120),
        smoke=Params(warmup=1, samples=2, budget_s=10, size=4, timeout_s=60, processes=3),
    ),
    Workload(
        "call_one",
        "latency",
        "call_one round trip (small value)",
        full=Params(warmup=300, samples=3000, budget_s=4, timeout_s=90),
        smoke=Params(warmup=200, samples=700, budget_s=2, timeout_s=60, processes=3),
    ),
    Workload(
        "throughput",
        "rate",
        "10,000 calls in flight, then awaited",
        full=Params(warmup=1, samples=3, budget_s=20, size=10_000, timeout_s=150),
        smoke=Params(warmup=1, samples=3, budget_s=5, size=5_000, timeout_s=60, processes=3),
        rate_unit="calls/s",
    ),
    Workload(
        "plain_throughput",
        "rate",
        "10,000 call_one on a one-actor slice of 4 procs, then get() each; torch imported",
        # What a user's training script gets: torch imported at the top of the client,
        # a fresh client process, one cold batch (no warm-up, no timeout argument).
        full=Params(warmup=0, samples=1, budget_s=20, size=10_000, timeout_s=150, processes=3),
        smoke=Params(warmup=0, samples=1, budget_s=5, size=2_000, timeout_s=60),
        rate_unit="calls/s",
        torch=True,
    ),
    Workload(
        "plain_throughput_notorch",
        "rate",
        "the same without torch in the client",
        full=Params(warmup=0, samples=1, budget_s=20, size=10_000, timeout_s=150, processes=3),
        smoke=Params(warmup=0, samples=1, budget_s=5, size=2_000, timeout_s=60),
        rate_unit="calls/s",
    ),
    Workload(
        "gather",
        "latency",
        "call + gather over 4 actors",
        full=Params(warmup=100, samples=1500, budget_s=4, size=4, timeout_s=90),
        smoke=Params(warmup=5, samples=30, budget_s=3, size=4, timeout_s=60),
    ),
    Workload(
        "gather64",
        "latency",
        "call + gather over 64 actors (one per proc)",
        full=Params(warmup=5, samples=200, budget_s=6, size=64, timeout_s=240),
        smoke=Params(warmup=1, samples=5, budget_s=3, size=8, timeout_s=90),
    ),
    Workload(
        "spawn64",
        "latency",
        "spawn 64 procs x 1 actor, until all answered",
        full=Params(warmup=1, samples=3, budget_s=40, size=64, timeout_s=300),
        smoke=Params(warmup=0, samples=1, budget_s=10, size=8, timeout_s=90),
    ),
    Workload(
        "payload_1MiB",
        "rate",
        "1 MiB numpy array to an actor (returns len)",
        full=Params(warmup=5, samples=60, budget_s=4, size=1 * MiB, timeout_s=90),
        smoke=Params(warmup=1, samples=3, budget_s=3, size=16 * 1024, timeout_s=60),
        rate_unit="MiB/s",
    ),
    Workload(
        "payload_16MiB",
        "rate",
        "16 MiB numpy array to an actor (returns len)",
        full=Params(warmup=2, samples=20, budget_s=6, size=16 * MiB, timeout_s=120),
        # The real size in smoke mode too: the regression guard reads it (GUARDED).
        smoke=Params(warmup=2, samples=5, budget_s=3, size=16 * MiB, timeout_s=60, processes=3),
        rate_unit="MiB/s",
    ),
    Workload(
        "payload_128MiB",
        "rate",
        "128 MiB numpy array to an actor (returns len)",
        full=Params(warmup=2, samples=6, budget_s=12, size=128 * MiB, timeout_s=180),
        smoke=Params(warmup=1, samples=3, budget_s=3, size=256 * 1024, timeout_s=60),
        rate_unit="MiB/s",
    ),
    Workload(
        "error",
        "latency",
        "endpoint raises ValueError: caller holds it",
        full=Params(warmup=30, samples=400, budget_s=3, timeout_s=90),
        smoke=Params(warmup=3, samples=10, budget_s=3, timeout_s=60),
    ),
    Workload(
        "crash",
        "latency",
        "actor proc exits mid-call: caller holds the error",
        # One fresh proc per sample; size = seconds a single crash may take before
        # it counts as not noticed.
        full=Params(warmup=0, samples=3, budget_s=15, size=30, timeout_s=180),
        smoke=Params(warmup=0, samples=1, budget_s=10, size=20, timeout_s=60),
    ),
    Workload(
        "memory",
        "size",
        "resident size (VmRSS) of an idle proc",
        # size = procs measured; budget_s doubles as the settle time before reading.
        full=Params(warmup=0, samples=4, budget_s=1.0, size=4, timeout_s=90),
        smoke=Params(warmup=0, samples=2, budget_s=0.2, size=2, timeout_s=60),
    ),
]

# Large values (issue 38): bandwidth and peak resident size beyond the value itself,
# as a call's argument, as a result, and through RDMABuffer between two procs of this
# host; the floor is a memcpy of the same size in one process.
GiB = 1 << 30
LARGE_SIZES = {"16MiB": 16 * MiB, "256MiB": 256 * MiB, "2GiB": 2 * GiB}
LARGE_MODES = {
    "arg": "a {} numpy array as a call's argument (the actor returns len)",
    "result": "a {} numpy array the actor returns",
    "rdma": "RDMABuffer.read_into of a {} buffer of another proc of this host",
}
for _mode, _title in LARGE_MODES.items():
    for _label, _n in LARGE_SIZES.items():
        _samples = 3 if _n >= GiB else 6
        WORKLOADS.append(
            Workload(
                f"large_{_mode}_{_label}",
                "rate",
                _title.format(_label),
                full=Params(warmup=1, samples=_samples, budget_s=20, size=_n, timeout_s=300),
                smoke=Params(warmup=1, samples=2, budget_s=3, size=256 * 1024, timeout_s=60),
                rate_unit="MiB/s",
                notes="extra: how far the peak resident size of client and proc rose",
            )
        )
LARGE = [w.name for w in WORKLOADS if w.name.startswith("large_")]

BY_NAME: dict[str, Workload] = {w.name: w for w in WORKLOADS}

# Systems in their default order; "floor" is the physical floor (raw sockets, raw copies).
SYSTEMS = ["floor", "danaus", "monarch", "ray", "danaus_nometrics", "danaus_traced"]
COMPARATORS = ["monarch", "ray"]

# The same danaus worker run another way: the environment it gets, and the only
# workloads it runs (their rows are ratios against "danaus" in the same run).
# "danaus" itself has metrics on (the default) and no trace running.
VARIANTS: dict[str, dict[str, str]] = {
    "danaus_nometrics": {"DANAUS_METRICS": "0"},  # everything off
    "danaus_traced": {"DANAUS_BENCH_TRACE": "1"},  # metrics on, inside danaus.trace()
}
VARIANT_WORKLOADS = {"call_one", "throughput"}

# Workloads a system does not run: 64 Ray worker processes (80 MB and a few
# seconds each) do not fit the 2-core development machine, and no target reads them.
# The large-value workloads read danaus's procs' memory and use its RDMABuffer: danaus
# against the floor only.
EXCLUDED: dict[str, set[str]] = {
    "ray": {"gather64", "spawn64", *LARGE},
    "monarch": set(LARGE),
}


def system_runs(system: str, workload: str) -> bool:
    """Whether ``system`` runs ``workload`` (variants run only a few)."""
    if workload in EXCLUDED.get(system, ()):
        return False
    return system not in VARIANTS or workload in VARIANT_WORKLOADS


# The smoke run's guard against silent regressions (``run.py --smoke``, run by CI):
# danaus's ratio to the floor measured in the same run, for each of these, fails
# the run when it is worse than GUARD_MARGIN times the ratio recorded in
# ``baseline.json`` (times: more than twice the recorded ratio; rates: less than
# half). ``run.py --smoke --write-baseline`` records a new baseline.
GUARDED = ("spawn", "call_one", "throughput", "payload_16MiB")
GUARD_MARGIN = 2.0
GUARD_TRIES = 3  # a failed ratio is measured again, up to this many runs in all


@dataclass(frozen=True)
class Target:
    """``danaus / against`` (or danaus alone when ``against`` is None) ``op`` ``bound``."""

    workload: str
    against: str | None  # "floor", "monarch", "ray", a variant, or None (absolute)
    op: str  # "<=", ">=", "<"
    bound: float
    text: str
    stat: str = "median"  # which danaus statistic an absolute target reads
    extra: dict[str, Any] = field(default_factory=dict)
    system: str = "danaus"  # the numerator


TARGETS: list[Target] = [
    Target("call_one", "floor", "<=", 3.0, "call_one round trip <= 3x the raw socket floor"),
    Target("call_one", "monarch", "<=", 0.25, "call_one round trip <= 0.25x Monarch"),
    Target("throughput", "monarch", ">=", 8.0, "throughput >= 8x Monarch's calls/s"),
    Target(
        "plain_throughput",
        "monarch",
        ">=",
        8.0,
        "plain pattern (10,000 call_one on a slice, torch imported) >= 8x Monarch's calls/s",
    ),
    Target(
        "plain_throughput_notorch",
        "monarch",
        ">=",
        8.0,
        "plain pattern without torch >= 8x Monarch's calls/s",
    ),
    Target("gather", "monarch", "<=", 0.25, "call + gather over 4 <= 0.25x Monarch"),
    Target("gather64", "monarch", "<=", 1.0, "call + gather over 64 procs faster than Monarch"),
    Target(
        "payload_1MiB",
        "floor",
        ">=",
        0.6,
        "payload 1 MiB >= 0.6x a raw socketpair transfer (issue 39)",
        extra={"against_stat": "socket_mib_s"},  # the floor's reference, not its memcpy
    ),
    Target("payload_16MiB", "monarch", ">=", 4.0, "payload 16 MiB >= 4x Monarch's MiB/s"),
    Target("payload_128MiB", "monarch", ">=", 4.0, "payload 128 MiB >= 4x Monarch's MiB/s"),
    Target("crash", "monarch", "<=", 0.01, "crash noticed in <= 0.01x Monarch's time"),
    Target("crash", "ray", "<=", 1.0, "crash noticed no slower than Ray"),
    Target("spawn", "monarch", "<=", 0.5, "spawn of 4 procs <= 0.5x Monarch"),
    Target("spawn64", "monarch", "<=", 1.0, "spawn of 64 procs faster than Monarch"),
    Target(
        "call_one",
        "danaus_nometrics",
        "<=",
        1.05,
        "call_one with metrics on <= 1.05x everything off",
    ),
    Target(
        "throughput",
        "danaus_nometrics",
        ">=",
        0.95,
        "throughput with metrics on >= 0.95x everything off",
    ),
    Target(
        "call_one",
        "danaus_nometrics",
        "<=",
        1.5,
        "call_one while tracing <= 1.5x everything off",
        system="danaus_traced",
    ),
    Target(
        "throughput",
        "danaus_nometrics",
        ">=",
        0.67,
        "throughput while tracing >= 0.67x everything off",
        system="danaus_traced",
    ),
    Target(
        "memory",
        None,
        "<",
        40e6,
        "idle proc without torch < 40 MB resident (worst proc)",
        stat="max",
    ),
]
