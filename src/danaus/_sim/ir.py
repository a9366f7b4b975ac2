"""Monarch's simulator IR, as far as its public tests and tools use it: a control DAG
of ``Command`` nodes and a data DAG of tensor events, exported as a catalogue of
command types keyed for timing (``IRGraph.export_command_types``).

danaus's simulator does not build this graph itself (``Simulator(build_ir=True)`` is
not supported); a tool that builds one (``insert_node``, ``update_tensor``) gets
Monarch's export format, with timings from this package's models: collectives and
sends from the communication model, ops measured on this machine.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from . import comm
from .costs import MeasuredCosts, TensorSpec

__all__ = ["Command", "IRGraph", "TensorAccessEvent", "TensorCreationEvent"]

log = logging.getLogger("danaus.simulator")

_FALLBACK_OP_US = 10_000  # Monarch's: an op that cannot be timed here


class Command(NamedTuple):
    """A node of the control DAG: one command on one worker's stream; ``duration`` in µs."""

    worker_rank: int
    stream_name: str
    command_id: int
    command_name: str  # "CallFunction: aten.mm", "Reduce: all_reduce: 3", "SendTensor: 7"
    devices: list[int]
    control_dependencies: list[int]
    traceback: Sequence[Any]
    duration: int = 0


class _TensorEvent(NamedTuple):
    """A node of the data DAG: what command ``command_id`` did to tensor ``DTensorRef``
    (in storage ``storage_id``); the subclass says what."""

    command_id: int
    DTensorRef: int
    storage_id: int
    dtype: torch.dtype | None
    dims: tuple[int, ...] | None
    devices: list[int]
    mesh_ref: int | None
    stream_name: str


class TensorCreationEvent(_TensorEvent):
    """Command ``command_id`` made tensor ``DTensorRef`` (in storage ``storage_id``)."""

    __slots__ = ()


class TensorAccessEvent(_TensorEvent):
    """Command ``command_id`` used tensor ``DTensorRef``."""

    __slots__ = ()


Shapes = list[tuple[tuple[int, ...], "torch.dtype | None"]]


class IRGraph:
    """The control DAG (``control_dag``: ``Command``s) and the data DAG (``data_dag``:
    tensor events) of a program."""

    def __init__(self) -> None:
        self.control_dag: list[Command] = []
        self.data_dag: list[Any] = []
        self._storage_of: dict[int, int] = {}
        self._ref_storage: dict[int, int] = {}

    def insert_node(
        self,
        worker_rank: int,
        stream_name: str,
        command_id: int,
        command_name: str,
        devices: list[int],
        control_dependencies: list[int],
        traceback: Sequence[Any],
    ) -> None:
        self.control_dag.append(
            Command(
                worker_rank,
                stream_name,
                command_id,
                command_name,
                list(devices),
                list(control_dependencies),
                traceback,
            )
        )

    def update_tensor(
        self,
        temp_id: int,
        ref: int,
        dtype: torch.dtype,
        dims: tuple[int, ...],
        worker_rank: int,
        stream_name: str,
        command_id: int,
        mutate: bool = False,
        borrow_src_tensor_ref: int | None = None,
        tensor_size: int | None = None,
        mesh_ref: int | None = None,
    ) -> None:
        """Tensor ``ref`` (``temp_id`` names its storage) is used by ``command_id``; the
        first use of a new storage makes it."""
        new = temp_id not in self._storage_of
        if new:
            if borrow_src_tensor_ref is not None and borrow_src_tensor_ref in self._ref_storage:
                self._storage_of[temp_id] = self._ref_storage[borrow_src_tensor_ref]
            else:
                self._storage_of[temp_id] = len(self._storage_of) + 1
        storage = self._storage_of[temp_id]
        self._ref_storage[ref] = storage
        fields = (
            command_id,
            ref,
            storage,
            dtype,
            tuple(dims),
            [worker_rank],
            mesh_ref,
            stream_name,
        )
        if new and borrow_src_tensor_ref is None:
            self.data_dag.append(TensorCreationEvent(*fields))
        self.data_dag.append(TensorAccessEvent(*fields))

    # -- timing keys -----------------------------------------------------------------------

    def _shape_maps(self) -> tuple[dict[int, Shapes], dict[int, Shapes]]:
        outputs: set[tuple[int, int]] = set()
        made: dict[int, Shapes] = defaultdict(list)
        for e in self.data_dag:
            if isinstance(e, TensorCreationEvent):
                outputs.add((e.command_id, e.DTensorRef))
                if e.dims is not None:
                    made[e.command_id].append((tuple(e.dims), e.dtype))
        used: dict[int, Shapes] = defaultdict(list)
        for e in self.data_dag:
            inp = (e.command_id, e.DTensorRef) not in outputs
            if isinstance(e, TensorAccessEvent) and e.dims is not None and inp:
                used[e.command_id].append((tuple(e.dims), e.dtype))
        return used, made

    @staticmethod
    def _parse(name: str) -> tuple[str, str]:
        parts = [p.strip() for p in name.split(":")]
        return parts[0], parts[1] if len(parts) > 1 else "unknown"

    def _key(
        self, cmd: Command, used: dict[int, Shapes], made: dict[int, Shapes]
    ) -> tuple[str, Shapes]:
        kind, sub = self._parse(cmd.command_name)
        shapes = used.get(cmd.command_id, []) or made.get(cmd.command_id, [])
        s = "x".join("(" + "x".join(str(d) for d in dims) + ")" for dims, _ in shapes)
        d = str(shapes[0][1]).replace("torch.", "") if shapes and shapes[0][1] else "unknown"
        tail = f"{s}:{d}" if s else d
        if kind == "CallFunction":
            return f"{kind}:{sub}:{tail}", shapes
        if kind == "Reduce":
            return f"{kind}:{sub}:{tail}:{len(cmd.devices)}", shapes
        if kind == "SendTensor":
            return f"{kind}:{tail}", shapes
        return kind, shapes

    def export_command_types(
        self,
        output_file: str,
        include_timing: bool = False,
        network_config: comm.NetworkConfig | None = None,
    ) -> None:
        """Write ``{"command_types": [{"timing_key", "count", ...}]}`` to ``output_file``:
        one entry per distinct timing key (``CallFunction:{op}:{shapes}:{dtype}``,
        ``Reduce:{kind}:{shape}:{dtype}:{devices}``, ``SendTensor:{shape}:{dtype}``,
        or the command's type). ``include_timing`` adds ``"timing"`` (µs by key) and
        applies it to the commands: ops measured here, collectives and sends from
        ``network_config``'s model, other commands 100 µs."""
        used, made = self._shape_maps()
        entries: dict[str, dict[str, Any]] = {}
        for cmd in self.control_dag:
            key, shapes = self._key(cmd, used, made)
            kind, _sub = self._parse(cmd.command_name)
            if key not in entries:
                entry: dict[str, Any] = {"timing_key": key, "count": 0}
                if shapes and not kind.startswith("Borrow"):
                    if kind == "CallFunction":
                        entry["input_shapes"] = [list(dims) for dims, _ in shapes]
                    else:
                        entry["tensor_shape"] = list(shapes[0][0])
                    dt = shapes[0][1]
                    entry["dtype"] = str(dt).replace("torch.", "") if dt else "unknown"
                if kind == "Reduce":
                    entry["num_devices"] = len(cmd.devices)
                entries[key] = entry
            entries[key]["count"] += 1
        timing: dict[str, int] = {}
        if include_timing:
            config = network_config or comm.NetworkConfig()
            for key, entry in entries.items():
                timing[key] = entry["timing_us"] = self._time(key, entry, config)
        out: dict[str, Any] = {"command_types": list(entries.values())}
        if include_timing:
            out["timing"] = timing
        with open(output_file, "w") as f:
            json.dump(out, f, indent=2)
        if include_timing:
            self.import_timing(timing)

    @staticmethod
    def _time(key: str, entry: dict[str, Any], config: comm.NetworkConfig) -> int:
        kind = key.split(":")[0]
        dtype = entry.get("dtype", "float32")
        if kind == "Reduce":
            return comm.estimate_collective_time_us(
                key.split(":")[1],
                entry.get("tensor_shape", []),
                dtype,
                entry.get("num_devices", 1),
                config,
            )
        if kind == "SendTensor":
            return comm.estimate_send_time_us(entry.get("tensor_shape", []), dtype, config)
        if kind == "CallFunction" and "input_shapes" in entry:
            op = key.split(":")[1]
            ns, _, rest = op.partition(".")
            tdtype = getattr(torch, dtype, torch.float32)
            specs = tuple(TensorSpec(tuple(s), tdtype, "cpu") for s in entry["input_shapes"])
            try:
                costs = MeasuredCosts(reps=3, persist=False)
                seconds = costs.op(f"{ns}::{rest}", specs, {}, "cpu")
                return max(1, round(seconds * 1e6))
            except Exception as e:  # an op path it cannot resolve
                log.debug("simulator IR: cannot time %s here (%s)", key, e)
                return _FALLBACK_OP_US
        if kind == "CallFunction":
            return _FALLBACK_OP_US
        return 100

    def import_timing(self, timing: str | dict[str, int]) -> None:
        """Set each command's ``duration`` (µs) from ``timing`` (a dict by timing key, or
        the path of a JSON file holding one)."""
        if isinstance(timing, str):
            with open(timing) as f:
                data = json.load(f)
            timing = data.get("timing", data)
        assert isinstance(timing, dict)
        used, made = self._shape_maps()
        self.control_dag = [
            cmd._replace(duration=timing[k])
            if (k := self._key(cmd, used, made)[0]) in timing
            else cmd
            for cmd in self.control_dag
        ]
