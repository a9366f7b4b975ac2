"""The simulator's communication model: how long a collective or a copy takes.

Links come in classes: ``intra`` (between GPUs of one host, NVLink-like) and
``inter`` (between hosts, a network), each with a bandwidth and a latency
(``NetworkConfig``). A group of ranks uses the slowest class its members
span. All-reduce is priced with the ring and the tree algorithms (``algorithm``
picks one, ``"auto"`` the faster, as NCCL's tuner does):

- ring: ``2 (n-1)`` steps, each a latency plus ``bytes / n`` over the link:
  ``2 (n-1) (lat + B / (n bw))``;
- tree (a pipelined binary tree, reduce then broadcast): ``2 ceil(log2 n)``
  latencies plus the whole buffer twice over the link: ``2 ceil(log2 n) lat + 2 B / bw``.

Reduce-scatter and all-gather are half a ring; all-to-all sends ``(n-1)/n`` of
the buffer at ``bw * contention_factor`` (the share of bandwidth left when all
pairs talk at once); a point-to-point copy is one latency plus ``B / bw``.
The module-level functions keep Monarch's ``monarch.simulator.communication_model``
names and units (microseconds).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "LinkClass",
    "NetworkConfig",
    "collective_time_s",
    "estimate_collective_time_us",
    "estimate_send_time_us",
    "ring_all_reduce_s",
    "send_time_s",
    "tensor_size_bytes",
    "tree_all_reduce_s",
]

_DTYPE_BYTES = {
    "float64": 8,
    "double": 8,
    "int64": 8,
    "long": 8,
    "complex64": 8,
    "complex128": 16,
    "float32": 4,
    "float": 4,
    "int32": 4,
    "int": 4,
    "float16": 2,
    "half": 2,
    "bfloat16": 2,
    "int16": 2,
    "short": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}


def _dtype_bytes(dtype: Any) -> int:
    name = str(dtype)
    if name.startswith("torch."):
        name = name[len("torch.") :]
    return _DTYPE_BYTES.get(name, 4)


def tensor_size_bytes(shape: Sequence[int], dtype: Any) -> int:
    """Bytes of a dense tensor of ``shape`` and ``dtype`` (a name or ``torch.dtype``;
    an unknown name counts 4 bytes an element)."""
    return math.prod(int(s) for s in shape) * _dtype_bytes(dtype)


@dataclass(frozen=True)
class LinkClass:
    """One class of link: ``bandwidth`` in bytes a second, ``latency`` in seconds."""

    bandwidth: float
    latency: float

    def __post_init__(self) -> None:
        if not self.bandwidth > 0:
            raise ValueError(f"a link's bandwidth must be > 0 bytes/s, got {self.bandwidth!r}")
        if not self.latency >= 0:
            raise ValueError(f"a link's latency must be >= 0 seconds, got {self.latency!r}")


@dataclass(frozen=True)
class NetworkConfig:
    """Bandwidths (GB/s, 1e9 bytes) and latencies (microseconds) per link class.

    The defaults describe an H100 host (NVLink within, 400 Gb/s InfiniBand
    between, 8 GPUs a host); calibrate them with ``danaus.simulator.calibrate``
    for the machine you plan on. ``pcie_bandwidth_gbs`` prices copies between
    a GPU and its host's memory. ``algorithm``: ``"ring"``, ``"tree"`` or
    ``"auto"`` (whichever is faster for each all-reduce). ``host_cores``: where
    the host's CPUs move the data (gloo, CPU tensors), the cores its ranks
    share: with more ranks on a host than cores, each rank's transfers run at
    ``cores / ranks`` of the link's bandwidth (``None``: GPUs move it, no sharing).
    ``single_hop_latency_us`` (Monarch's name), when given, is both classes' latency.
    """

    intra_node_bandwidth_gbs: float = 450.0
    inter_node_bandwidth_gbs: float = 50.0
    intra_node_latency_us: float = 5.0
    inter_node_latency_us: float = 10.0
    gpus_per_node: int = 8
    contention_factor: float = 0.5
    pcie_bandwidth_gbs: float = 25.0
    algorithm: str = "auto"
    host_cores: int | None = None
    single_hop_latency_us: float | None = None  # Monarch's one latency for both classes

    def __post_init__(self) -> None:
        if self.algorithm not in ("ring", "tree", "auto"):
            raise ValueError(
                f"NetworkConfig.algorithm is {self.algorithm!r}; use 'ring', 'tree' or 'auto'"
            )
        if not 0 < self.contention_factor <= 1:
            raise ValueError(
                f"NetworkConfig.contention_factor must be in (0, 1], got {self.contention_factor!r}"
            )
        if self.gpus_per_node < 1:
            raise ValueError(f"NetworkConfig.gpus_per_node must be >= 1, got {self.gpus_per_node}")
        LinkClass(self.intra_node_bandwidth_gbs * 1e9, self.intra_node_latency_us * 1e-6)
        LinkClass(self.inter_node_bandwidth_gbs * 1e9, self.inter_node_latency_us * 1e-6)

    def link(self, cls: str) -> LinkClass:
        """The ``"intra"`` or ``"inter"`` link class."""
        hop = self.single_hop_latency_us
        if cls == "intra":
            lat = self.intra_node_latency_us if hop is None else hop
            return LinkClass(self.intra_node_bandwidth_gbs * 1e9, lat * 1e-6)
        if cls == "inter":
            lat = self.inter_node_latency_us if hop is None else hop
            return LinkClass(self.inter_node_bandwidth_gbs * 1e9, lat * 1e-6)
        raise ValueError(f"unknown link class {cls!r}; use 'intra' or 'inter'")

    def link_for(self, ranks: Sequence[int]) -> LinkClass:
        """The link class a group of global ranks uses: ``inter`` if they span hosts,
        its bandwidth shared out when the ranks on a host outnumber ``host_cores``."""
        per_host: dict[int, int] = {}
        for r in ranks:
            h = int(r) // self.gpus_per_node
            per_host[h] = per_host.get(h, 0) + 1
        link = self.link("intra" if len(per_host) <= 1 else "inter")
        crowd = max(per_host.values(), default=1)
        if self.host_cores is not None and crowd > self.host_cores:
            return LinkClass(link.bandwidth * self.host_cores / crowd, link.latency)
        return link


def ring_all_reduce_s(nbytes: int, n: int, link: LinkClass) -> float:
    """Seconds of a ring all-reduce of ``nbytes`` over ``n`` ranks."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return 2 * (n - 1) * (link.latency + nbytes / (n * link.bandwidth))


def tree_all_reduce_s(nbytes: int, n: int, link: LinkClass) -> float:
    """Seconds of a pipelined binary-tree all-reduce of ``nbytes`` over ``n`` ranks."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return 2 * math.ceil(math.log2(n)) * link.latency + 2 * nbytes / link.bandwidth


def collective_time_s(
    kind: str,
    nbytes: int,
    n: int,
    link: LinkClass,
    algorithm: str = "auto",
    contention_factor: float = 0.5,
) -> float:
    """Seconds of collective ``kind`` (all_reduce, reduce_scatter, all_gather,
    all_to_all; anything else is priced as an all-reduce) of an ``nbytes`` buffer."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    if kind in ("reduce_scatter", "all_gather"):
        return (n - 1) * (link.latency + nbytes / (n * link.bandwidth))
    if kind == "all_to_all":
        return (n - 1) * link.latency + (n - 1) / n * nbytes / (link.bandwidth * contention_factor)
    ring = ring_all_reduce_s(nbytes, n, link)
    tree = tree_all_reduce_s(nbytes, n, link)
    if algorithm == "ring":
        return ring
    if algorithm == "tree":
        return tree
    return min(ring, tree)


def send_time_s(nbytes: int, link: LinkClass) -> float:
    """Seconds of a point-to-point copy of ``nbytes``."""
    return 0.0 if nbytes <= 0 else link.latency + nbytes / link.bandwidth


def estimate_collective_time_us(
    reduce_type: str,
    tensor_shape: Sequence[int],
    dtype_str: Any,
    num_devices: int,
    config: NetworkConfig | None = None,
) -> int:
    """Microseconds (rounded up, at least 1) of collective ``reduce_type`` of a
    ``tensor_shape``/``dtype_str`` tensor over ``num_devices`` ranks, the first of which
    share a host (``gpus_per_node``); 0 for one rank or an empty shape."""
    config = config or NetworkConfig()
    if num_devices <= 1 or not tensor_shape:
        return 0
    nbytes = tensor_size_bytes(tensor_shape, dtype_str)
    if nbytes == 0:
        return 0
    link = config.link("intra" if num_devices <= config.gpus_per_node else "inter")
    t = collective_time_s(
        reduce_type, nbytes, num_devices, link, config.algorithm, config.contention_factor
    )
    return max(1, math.ceil(t * 1e6))


def estimate_send_time_us(
    tensor_shape: Sequence[int],
    dtype_str: Any,
    config: NetworkConfig | None = None,
    inter_node: bool = True,
) -> int:
    """Microseconds (rounded up, at least 1) of a point-to-point copy of a
    ``tensor_shape``/``dtype_str`` tensor; between hosts unless ``inter_node=False``
    (the conservative guess where the ranks are not known); 0 for an empty shape."""
    config = config or NetworkConfig()
    if not tensor_shape:
        return 0
    nbytes = tensor_size_bytes(tensor_shape, dtype_str)
    if nbytes == 0:
        return 0
    link = config.link("inter" if inter_node else "intra")
    return max(1, math.ceil(send_time_s(nbytes, link) * 1e6))
