"""The architecture's layering holds, and each public facade exports exactly what it pins."""

from __future__ import annotations

import ast
import importlib
import pathlib

import pytest

SRC = pathlib.Path(__file__).resolve().parents[1] / "src" / "danaus"

# The order of the architecture brief: a layer may import itself and those before it.
LAYERS = [
    "_mesh",
    "_wire",
    "_transport",
    "_runtime",
    "_actor",
    "_supervision",
    "_rdma",
    "_tensor",
    "_job",
    "_cli",
    "_observe",
]
BASE = {"_errors"}  # importable from every layer


def _danaus_imports(path: pathlib.Path) -> set[str]:
    """The top-level danaus subpackages or modules that ``path`` imports."""
    rel = path.relative_to(SRC).with_suffix("")
    package = list(rel.parts[:-1])  # the package a relative import starts from
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
                parts = [*base, *(node.module.split(".") if node.module else [])]
                if not parts:
                    parts = [alias.name for alias in node.names]
                found.add(parts[0])
            elif node.module and node.module.split(".")[0] == "danaus":
                rest = node.module.split(".")[1:]
                found.add(rest[0] if rest else "")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "danaus" and len(parts) > 1:
                    found.add(parts[1])
    return found


def _layer_files() -> list[tuple[str, pathlib.Path]]:
    out = []
    for layer in LAYERS:
        d = SRC / layer
        if d.is_dir():
            out.extend((layer, f) for f in sorted(d.rglob("*.py")))
    return out


@pytest.mark.parametrize(
    ("layer", "path"),
    _layer_files(),
    ids=lambda v: str(v.relative_to(SRC)) if isinstance(v, pathlib.Path) else v,
)
def test_lower_layers_never_import_higher_ones(layer: str, path: pathlib.Path) -> None:
    allowed = set(LAYERS[: LAYERS.index(layer) + 1]) | BASE
    imported = {m for m in _danaus_imports(path) if m.startswith("_")}
    assert imported <= allowed, f"{path.relative_to(SRC)} imports {sorted(imported - allowed)}"


def test_the_mesh_layer_imports_nothing_else_from_danaus() -> None:
    for path in (SRC / "_mesh").rglob("*.py"):
        assert {m for m in _danaus_imports(path) if m.startswith("_")} <= {"_mesh"}, path


FACADES = {
    "danaus.rdma": [
        "RDMAAction",
        "RDMABuffer",
        "RDMAError",
        "RDMAOwnerLostError",
        "get_rdma_backend",
        "is_ibverbs_available",
        "is_rdma_available",
    ],
    "danaus.job": [
        "JobState",
        "JobTrait",
        "LocalJob",
        "ProcessJob",
        "SSHJob",
        "SlurmError",
        "SlurmJob",
        "StartedWorker",
        "job_load",
        "job_loads",
    ],
    "danaus.spmd": ["SPMDActor", "setup_torch_elastic_env", "setup_torch_elastic_env_async"],
    "danaus.testing": [
        "ClientScript",
        "FaultRecorder",
        "client_env",
        "pid_alive",
        "wait_pids_gone",
    ],
    "danaus": ["DanausError", "Extent", "NDSlice", "Point", "Shape", "Slice"],
    "danaus.actor": [
        "Accumulator",
        "Actor",
        "ActorError",
        "ActorMesh",
        "Channel",
        "Context",
        "Endpoint",
        "Extent",
        "Future",
        "HostMesh",
        "Instance",
        "MeshFailure",
        "Point",
        "Port",
        "PortReceiver",
        "ProcMesh",
        "SupervisionError",
        "ValueMesh",
        "as_endpoint",
        "attach_to_workers",
        "concurrent_endpoint",
        "context",
        "current_actor_name",
        "current_rank",
        "current_size",
        "enable_transport",
        "endpoint",
        "get_or_spawn_controller",
        "hosts_from_config",
        "run_worker_loop_forever",
        "send",
        "shutdown_context",
        "this_host",
        "this_proc",
        "unhandled_fault_hook",
    ],
}


@pytest.mark.parametrize("module", sorted(FACADES))
def test_each_public_facade_pins_its_exports(module: str) -> None:
    mod = importlib.import_module(module)
    assert sorted(mod.__all__) == sorted(FACADES[module])
    for name in mod.__all__:
        assert hasattr(mod, name), f"{module}.{name} is in __all__ but missing"


def test_public_classes_show_their_public_module() -> None:
    import danaus.actor

    assert danaus.actor.ActorError.__module__ == "danaus.actor"
    assert danaus.actor.Actor.__module__ == "danaus.actor"
    assert danaus.actor.ValueMesh.__module__ == "danaus.actor"
