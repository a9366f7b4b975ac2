"""The architecture's layering holds, and each public facade exports exactly what it pins."""

from __future__ import annotations

import ast
import importlib
import pathlib
import re

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
    "_elastic",
    "_observe",
    "_cli",
]
BASE = {"_errors", "_config"}  # importable from every layer
# The only upward imports allowed, each inside a function so it runs on use only:
# ProcMesh.activate()/rank() load the tensor engine, an optional extra that needs torch;
# DANAUS_DASHBOARD=1 starts the dashboard (the observing layer) at the first spawn.
# A node loads the bootstrap by name (``importlib.import_module(BOOTSTRAP)``) when it
# starts: the bootstrap sits above every layer, since it installs all of them.
UPWARD = {"_actor/api/procs.py": {"_tensor", "_observe"}, "_runtime/node.py": {"_bootstrap"}}


def _module_constants(tree: ast.Module) -> dict[str, str]:
    """The module-level ``NAME = "string"`` assignments of ``tree``."""
    out = {}
    for stmt in tree.body:
        targets = stmt.targets if isinstance(stmt, ast.Assign) else []
        if isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            targets = [stmt.target]
        value = getattr(stmt, "value", None)
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            out.update({t.id: value.value for t in targets if isinstance(t, ast.Name)})
    return out


def _named_modules(call: ast.AST, constants: dict[str, str]) -> list[str]:
    """The danaus modules an ``importlib.import_module(...)`` call loads by name: the
    string literals (or module constants holding one) in its first argument."""
    if not (isinstance(call, ast.Call) and call.args):
        return []
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if name not in ("import_module", "__import__"):
        return []
    names = []
    for node in ast.walk(call.args[0]):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.append(node.value)
        elif isinstance(node, ast.Name) and node.id in constants:
            names.append(constants[node.id])
    return [n for n in names if n.split(".")[0] == "danaus"]


def _danaus_imports(path: pathlib.Path) -> set[str]:
    """The top-level danaus subpackages or modules that ``path`` imports, by an import
    statement or by name (``importlib.import_module("danaus._x")``)."""
    rel = path.relative_to(SRC).with_suffix("")
    package = list(rel.parts[:-1])  # the package a relative import starts from
    found: set[str] = set()
    tree = ast.parse(path.read_text())
    constants = _module_constants(tree)
    for node in ast.walk(tree):
        for named in _named_modules(node, constants):
            rest = named.split(".")[1:]
            found.add(rest[0] if rest else "")
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
    allowed |= UPWARD.get(str(path.relative_to(SRC)), set())
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
        "RDMAReadTransferWarning",
        "RDMATamperedError",
        "RDMATcpFallbackWarning",
        "RDMAWriteTransferWarning",
        "get_rdma_backend",
        "gpu_direct_rdma_supported",
        "is_ibverbs_available",
        "is_rdma_available",
    ],
    "danaus.elastic": [
        "ElasticMesh",
        "ElasticReplica",
        "ElasticStats",
        "Membership",
        "MembershipChanged",
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
        "hosts_from_config",
        "job_load",
        "job_loads",
    ],
    "danaus.tools.config": ["Workspace"],
    "danaus.spmd": ["SPMDActor", "setup_torch_elastic_env", "setup_torch_elastic_env_async"],
    "danaus.config": [
        "SETTINGS",
        "Setting",
        "clear_runtime_config",
        "configure",
        "configured",
        "get_global_config",
        "get_runtime_config",
    ],
    "danaus.testing": [
        "ClientScript",
        "FaultRecorder",
        "SimulatedMesh",
        "client_env",
        "freeze",
        "pid_alive",
        "wait_pids_gone",
        "wait_until",
    ],
    "danaus.dashboard": ["Dashboard", "serve"],
    "danaus": [
        "DanausError",
        "Extent",
        "NDSlice",
        "Point",
        "RemoteTensorError",
        "Shape",
        "Slice",
        "Stream",
        "Tensor",
        "call_on_shard_and_fetch",
        "coalescing",
        "clear_runtime_config",
        "configure",
        "configured",
        "fetch_shard",
        "get_active_mesh",
        "get_active_stream",
        "get_global_config",
        "get_runtime_config",
        "grad_generator",
        "inspect",
        "no_mesh",
        "reduce",
        "reduce_",
        "remote",
        "show",
        "slice_mesh",
        "stats",
        "to_mesh",
        "trace",
    ],
    "danaus.actor": [
        "Accumulator",
        "Actor",
        "ActorError",
        "ActorMesh",
        "Channel",
        "ChannelTransport",
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
        "debug_controller",
        "enable_transport",
        "endpoint",
        "get_or_spawn_controller",
        "local_proc_mesh",
        "proc_mesh",
        "hosts_from_config",
        "run_worker_loop_forever",
        "send",
        "shutdown_context",
        "sim_proc_mesh",
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


# -- every name a Monarch program imports has a danaus counterpart or a documented reason ----
#
# The ``__all__`` lists of Monarch 0.7.0, read from the wheel on PyPI
# (torchmonarch-0.7.0-cp311-cp311-manylinux2014_x86_64.whl: monarch/__init__.py,
# monarch/actor/__init__.py, monarch/rdma/__init__.py, monarch/job/__init__.py).
MONARCH_0_7 = {
    "monarch.actor": """Accumulator Actor ActorError Channel ChannelTransport Context Endpoint
        Extent Future HostMesh MeshFailure Point Port PortReceiver ProcId ProcMesh Uid ValueMesh
        as_endpoint attach attach_to_workers concurrent_endpoint config context
        current_actor_name current_rank current_size debug_controller default_bootstrap_cmd
        enable_transport endpoint get_meter get_or_spawn_controller returns_future
        run_worker_loop_forever run_worker_loop_until_shutdown send shutdown_context span
        start_worker_loop_forever this_host this_proc traced unhandled_fault_hook""",
    "monarch.rdma": """RDMAAction RDMABuffer RDMAReadTransferWarning RDMATcpFallbackWarning
        RDMAWriteTransferWarning get_rdma_backend is_ibverbs_available is_rdma_available""",
    "monarch.job": """DEFAULT_JOB_PATH JobState JobTrait LocalJob MeshAdminConfig PortForwarder
        ProcessJob SERVICE_PROC_IDS_ENV SERVICE_PROC_RANK_ENV SlurmJob TelemetryConfig
        deserialize_service_proc_ids exec_command hosts_from_config job_load job_loads
        load_current_job new_service_proc_id ranked_service_proc_id_from_env
        serialize_service_proc_ids service_proc_addr service_proc_addrs set_current_job shell""",
    "monarch": """ActorFuture Extent Future NDSlice OpaqueRef RemoteProcessGroup Selection Shape
        Simulator Stream Tensor builtins call_on_shard_and_fetch clear_runtime_config coalescing
        configure configured fetch_shard function_resolvers get_active_mesh get_active_stream
        get_global_config get_runtime_config grad_function grad_generator inspect mast_reserve
        no_mesh reduce reduce_ remote set_meta show slice_mesh timer to_mesh world_mesh""",
}

# Names older Monarch programs import that 0.7 no longer exports (issue 16).
MONARCH_OLDER = {
    "monarch.actor": ["local_proc_mesh", "proc_mesh", "sim_proc_mesh"],
    "monarch.rdma": ["gpu_direct_rdma_supported"],
}

# Top-level names of Monarch's tensor engine that danaus does not provide; each is
# also listed, with the reason, in docs/monarch-differences.md.
TENSOR_ENGINE_NOT_YET_AVAILABLE = [
    "grad_function",
    "OpaqueRef",
    "RemoteProcessGroup",
    "Selection",
    "Simulator",
    "function_resolvers",
    "builtins",
    "world_mesh",
    "set_meta",
    "timer",
    "mast_reserve",
]

DIFFERENCES = SRC.parents[1] / "docs" / "monarch-differences.md"


def _documented_names() -> set[str]:
    """The names in the table of the differences document's "not yet available" section."""
    text = DIFFERENCES.read_text()
    section = text.split("## Names not yet available", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    return {name for row in rows for name in re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", row)}


def _danaus_module(monarch_module: str) -> str:
    return monarch_module.replace("monarch", "danaus", 1)


@pytest.mark.parametrize("module", sorted(MONARCH_0_7))
def test_every_monarch_name_has_a_danaus_counterpart_or_a_documented_reason(module: str) -> None:
    danaus_mod = importlib.import_module(_danaus_module(module))
    documented = _documented_names()
    names = MONARCH_0_7[module].split() + MONARCH_OLDER.get(module, [])
    missing = [n for n in names if not hasattr(danaus_mod, n) and n not in documented]
    assert not missing, (
        f"{module} exports {missing}, which {danaus_mod.__name__} lacks; add them or list them "
        f"in the 'Names not yet available' table of {DIFFERENCES.name}"
    )


def test_the_tensor_engine_names_not_yet_available_are_documented() -> None:
    import danaus

    absent = [n for n in TENSOR_ENGINE_NOT_YET_AVAILABLE if not hasattr(danaus, n)]
    assert set(absent) <= _documented_names()


def test_importing_danaus_and_its_actor_core_never_imports_torch() -> None:
    import subprocess
    import sys

    code = (
        "import sys, danaus, danaus.actor, danaus.rdma, danaus.job; "
        "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if 'torch' in m)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_upward_import_of_the_tensor_engine_only_happens_inside_functions() -> None:
    for rel in UPWARD:
        tree = ast.parse((SRC / rel).read_text())
        constants = _module_constants(tree)
        for node in tree.body:  # module level: no import of a higher layer
            if isinstance(node, ast.ImportFrom) and node.module:
                for layer in UPWARD[rel]:
                    assert layer not in node.module, f"{rel} imports {layer} at module level"
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            for sub in ast.walk(node):  # nor by name
                for named in _named_modules(sub, constants):
                    assert named.split(".")[1] not in UPWARD[rel], (
                        f"{rel} imports {named} at module level"
                    )


def test_imports_by_name_are_seen() -> None:
    """``node.py`` loads the bootstrap by name: the layer check must see that."""
    assert "_bootstrap" in _danaus_imports(SRC / "_runtime" / "node.py")


# -- nothing sets attributes on another layer's object ------------------------------------

RUNTIME_PY = SRC / "_runtime" / "runtime.py"
# What a runtime is called where it is used: ``rt.x = ...``, ``self.rt.x = ...``,
# ``runtime.x = ...``, ``node.runtime.x = ...``.
RUNTIME_NAMES = {"rt", "runtime", "_rt"}


def _is_runtime(expr: ast.expr) -> bool:
    if isinstance(expr, ast.Name):
        return expr.id in RUNTIME_NAMES
    return isinstance(expr, ast.Attribute) and expr.attr in RUNTIME_NAMES


def _assigned(target: ast.expr) -> list[ast.expr]:
    """What an assignment's target binds: itself, or each element of a tuple or list."""
    if isinstance(target, (ast.Tuple, ast.List)):
        return [t for elt in target.elts for t in _assigned(elt)]
    if isinstance(target, ast.Starred):
        return _assigned(target.value)
    return [target]


def _runtime_assignments(path: pathlib.Path) -> list[str]:
    """``line: code`` of each assignment to an attribute of a runtime in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Assign):
            targets = [t for tgt in node.targets for t in _assigned(tgt)]
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setattr":
            targets = [ast.Attribute(value=node.args[0], attr="?")] if node.args else []
        else:
            continue
        for t in targets:
            if isinstance(t, ast.Attribute) and _is_runtime(t.value):
                found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_scan_finds_assignments_to_a_runtimes_attributes(tmp_path: pathlib.Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "rt.bounce = f\nself.rt.tracer = None\nnode.runtime.boot = {}\n"
        "a, runtime.secret = 1, 2\nrt.waits += 1\nsetattr(rt, 'logs', x)\n"
        "rt.observers['x'] = f\nrt.set_tracer(None)\nself.rtx = rt\n"
    )
    assert [line.split(":")[0] for line in _runtime_assignments(sample)] == list("123456")


def test_no_module_outside_the_runtime_sets_attributes_on_a_runtime() -> None:
    """Higher layers register hooks and state through the runtime's methods
    (``set_bounce_handler``, ``set_block_hook``, ``set_tracer``, ``set_secret``, ...)
    or keep it in a node part; they never assign a runtime's attributes."""
    found = {
        str(path.relative_to(SRC)): hits
        for path in sorted(SRC.rglob("*.py"))
        if path != RUNTIME_PY and (hits := _runtime_assignments(path))
    }
    assert not found, f"assignments to a runtime's attributes outside runtime.py: {found}"
