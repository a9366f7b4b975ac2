"""What each simulated task costs, in seconds: fixed guesses, or measured and cached.

``FixedCosts`` is Monarch's model: every op 10 us, every collective 100 us
(the default, so Monarch's programs and tests get Monarch's numbers).
``MeasuredCosts`` times each op on this machine's device the first time it
sees it (real tensors of the recorded sizes and dtypes, a warm-up then the
fastest of ``reps`` runs) and keeps the figure in a JSON file keyed by op,
argument shapes, dtypes and device, so the next simulation of the same
program measures nothing. Collectives and copies go through the
communication model (``comm``) in both.
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import _disable_current_modes

from . import comm

__all__ = ["CostModel", "FixedCosts", "MeasuredCosts", "TensorSpec", "default_cache_path"]

log = logging.getLogger("danaus.simulator")


@dataclass(frozen=True)
class TensorSpec:
    """A simulated tensor as an op's cost sees it: sizes, dtype and device type."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    device: str  # "cuda" or "cpu": the simulated device, not where it is measured

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    def key(self) -> str:
        return f"T({','.join(map(str, self.shape))};{str(self.dtype).replace('torch.', '')})"


class CostModel:
    """The interface the simulator prices tasks with (all in seconds)."""

    network: comm.NetworkConfig

    def op(self, name: str, args: Any, kwargs: Any, device: str) -> float:
        raise NotImplementedError

    def remote(self, name: str, args: Any, kwargs: Any, fn: Any = None) -> float:
        """A remote function ``name`` (``fn`` itself where it can run here)."""
        raise NotImplementedError

    def collective(self, kind: str, nbytes: int, ranks: Sequence[int]) -> float:
        raise NotImplementedError

    def send(self, nbytes: int, src: int, dst: int) -> float:
        raise NotImplementedError

    def host_copy(self, nbytes: int) -> float:
        """A copy between a GPU and its host's memory (``fetch_shard``, CPU offload)."""
        raise NotImplementedError

    def save(self) -> None:
        """Keep what was measured (a no-op where nothing is)."""


class FixedCosts(CostModel):
    """Monarch's fixed guesses: ``compute`` seconds per op or remote function,
    ``collective`` per collective or copy between procs."""

    def __init__(
        self,
        compute: float = 10e-6,
        collective: float = 100e-6,
        network: comm.NetworkConfig | None = None,
    ) -> None:
        if compute < 0 or collective < 0:
            raise ValueError(f"costs must be >= 0 seconds, got {compute!r} and {collective!r}")
        self.compute = compute
        self.collective_cost = collective
        self.network = network or comm.NetworkConfig()

    def op(self, name: str, args: Any, kwargs: Any, device: str) -> float:
        return self.compute

    def remote(self, name: str, args: Any, kwargs: Any, fn: Any = None) -> float:
        return self.compute

    def collective(self, kind: str, nbytes: int, ranks: Sequence[int]) -> float:
        return self.collective_cost

    def send(self, nbytes: int, src: int, dst: int) -> float:
        return self.collective_cost

    def host_copy(self, nbytes: int) -> float:
        return self.compute


def default_cache_path() -> Path:
    """``$DANAUS_SIM_CACHE``, else ``~/.cache/danaus/simulator/op_costs.json``."""
    env = os.environ.get("DANAUS_SIM_CACHE")
    if env:
        return Path(env)
    return Path.home() / ".cache" / "danaus" / "simulator" / "op_costs.json"


def _resolve_op(name: str) -> Any:
    ns, rest = name.split("::", 1)
    base, _, overload = rest.partition(".")
    return getattr(getattr(getattr(torch.ops, ns), base), overload or "default")


class MeasuredCosts(CostModel):
    """Op costs measured on ``device`` (this machine's GPU if it has one, else its CPU)
    and cached in the JSON file ``cache_path``.

    ``speedup`` divides what is measured for ops of simulated GPU tensors
    (1.0: the simulated GPU is as fast as the measuring device). ``remote_costs``
    gives remote functions by name a cost in seconds; the rest are timed by
    running them on real tensors here when they take no process group, and
    cost ``fallback`` seconds otherwise. Ops that cannot run on made-up values
    (an index out of range, say) also cost ``fallback``; the cache says so.
    ``persist=False`` keeps the measurements in memory only.
    """

    def __init__(
        self,
        cache_path: str | os.PathLike[str] | None = None,
        *,
        device: str | torch.device | None = None,
        network: comm.NetworkConfig | None = None,
        reps: int = 5,
        speedup: float = 1.0,
        fallback: float = 10e-6,
        remote_costs: dict[str, float] | None = None,
        persist: bool = True,
    ) -> None:
        if reps < 1:
            raise ValueError(f"reps must be >= 1, got {reps}")
        if speedup <= 0:
            raise ValueError(f"speedup must be > 0, got {speedup}")
        self.path = Path(cache_path) if cache_path is not None else default_cache_path()
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        self.network = network or comm.NetworkConfig()
        self.reps = reps
        self.speedup = speedup
        self.fallback = fallback
        self.remote_costs = dict(remote_costs or {})
        self.measured = 0  # ops timed by this model (the rest came from the cache)
        self._lock = threading.Lock()
        self._dirty = False
        self.table: dict[str, float] = {}
        self.persist = persist
        if persist and self.path.exists():
            try:
                data = json.loads(self.path.read_text())
                self.table = {str(k): float(v) for k, v in data.get("ops", {}).items()}
            except (OSError, ValueError, AttributeError) as e:
                log.warning(
                    "simulator: ignoring the unreadable op-cost cache %s (%s)", self.path, e
                )

    # -- keys and measurement ---------------------------------------------------------

    def _key(self, name: str, args: Any, kwargs: Any) -> str:
        def enc(x: Any) -> Any:
            if isinstance(x, TensorSpec):
                return x.key()
            if isinstance(x, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
                return str(x)
            if isinstance(x, (int, float, bool, str)) or x is None:
                return x
            return type(x).__name__

        leaves, spec = pytree.tree_flatten((args, kwargs))
        body = json.dumps([enc(x) for x in leaves]) + "".join(str(spec).split())
        return f"{name}|{body}|{self.device.type}"

    def _materialise(self, x: Any) -> Any:
        if isinstance(x, TensorSpec):
            if x.dtype.is_floating_point or x.dtype.is_complex:
                return torch.rand(x.shape, dtype=x.dtype, device=self.device)
            if x.dtype == torch.bool:
                return torch.zeros(x.shape, dtype=x.dtype, device=self.device)
            return torch.zeros(x.shape, dtype=x.dtype, device=self.device)
        if isinstance(x, torch.device):
            return self.device
        if isinstance(x, torch.Tensor):  # a value the client sent (a lifted constant)
            return x.to(self.device)
        return x

    def _time(self, fn: Callable[[], Any]) -> float:
        sync: Callable[[], Any] = (
            torch.cuda.synchronize if self.device.type == "cuda" else (lambda: None)
        )
        fn()  # warm-up: allocator, kernels' first launch
        sync()
        times = []
        for _ in range(self.reps):
            t0 = time.perf_counter()
            fn()
            sync()
            times.append(time.perf_counter() - t0)
        return min(times)  # the least disturbed run: others' load only ever adds time

    def _measure(self, key: str, prepare: Callable[[], Callable[[], Any]]) -> float:
        with self._lock:
            hit = self.table.get(key)
        if hit is not None:
            return hit
        try:
            # the program's mesh may be active on this thread: these ops are local
            with _disable_current_modes(), torch.no_grad():
                cost = self._time(prepare())
        except Exception as e:  # made-up values it cannot take: a guess, said so once
            log.debug("simulator: could not time %s (%s); using %s s", key, e, self.fallback)
            cost = -self.fallback  # negative: a fallback, not a measurement
        with self._lock:
            self.table[key] = cost
            self._dirty = True
            self.measured += 1
        return cost

    def op(self, name: str, args: Any, kwargs: Any, device: str) -> float:
        key = self._key(name, args, kwargs)

        def prepare() -> Callable[[], Any]:
            a, k = pytree.tree_map(self._materialise, (args, kwargs))
            if "device" in k:
                k = {**k, "device": self.device}
            op = _resolve_op(name)
            return lambda: op(*a, **k)  # inputs made once, outside the timed runs

        cost = abs(self._measure(key, prepare))
        return cost / self.speedup if device == "cuda" else cost

    def remote(self, name: str, args: Any, kwargs: Any, fn: Any = None) -> float:
        if name in self.remote_costs:
            return self.remote_costs[name]
        if fn is None:
            return self.fallback
        key = self._key("remote:" + name, args, kwargs)

        def prepare() -> Callable[[], Any]:
            a, k = pytree.tree_map(self._materialise, (args, kwargs))
            return lambda: fn(*a, **k)

        return abs(self._measure(key, prepare))

    def collective(self, kind: str, nbytes: int, ranks: Sequence[int]) -> float:
        net = self.network
        return comm.collective_time_s(
            kind, nbytes, len(ranks), net.link_for(ranks), net.algorithm, net.contention_factor
        )

    def send(self, nbytes: int, src: int, dst: int) -> float:
        return comm.send_time_s(nbytes, self.network.link_for((src, dst)))

    def host_copy(self, nbytes: int) -> float:
        return nbytes / (self.network.pcie_bandwidth_gbs * 1e9)

    def save(self) -> None:
        """Write the table to ``cache_path`` (atomically: a crash leaves the old file)."""
        with self._lock:
            if not self._dirty or not self.persist:
                return
            table = dict(self.table)
            self._dirty = False
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump({"version": 1, "ops": table}, f, indent=0, sort_keys=True)
            os.replace(tmp, self.path)
        except BaseException:
            os.unlink(tmp)
            raise
