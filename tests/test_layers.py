"""The architecture's layering holds, and each public facade exports exactly what it pins."""

from __future__ import annotations

import ast
import importlib
import json
import pathlib
import re
from typing import Any

import pytest

import source_ast

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
    "_sim",
    "_job",
    "_elastic",
    "_observe",
    "_cli",
]
# Importable from every layer; ``_boothook`` is where the package registers the bootstrap
# and a starting node asks for it.
BASE = {"_errors", "_config", "_boothook"}
# No upward reference is allowed. The bootstrap sits above every layer, since it installs
# all of them; the package registers it (``danaus/__init__`` -> ``_boothook``) and a node
# asks for it when it starts. It also fills in what higher layers add to lower ones (the
# tensor engine and the dashboard, which ``_actor/api/extensions.py`` calls), so no layer
# imports a higher one, not even by name.
UPWARD: dict[str, set[str]] = {}

# The sub-layers of a layer, in order: a module may import its own sub-layer and the
# groups listed before its own, never a later one nor a peer in its own group (a
# sub-layer is a subpackage, or a module directly in the layer's package). Imports
# inside functions count; those under ``if TYPE_CHECKING:`` (annotations only) do not.
SUBLAYERS = {
    # the actor core (cells, ports, futures, context) < the API built on it
    # (meshes, adverbs, proc and host meshes) < what builds on the API
    "_actor": [("core",), ("api",), ("tools", "debugger")],
    # the runtime (I/O loop, peers, mailboxes) < the node holding it < the log
    # forwarding and the hosting (agent, zygote, procs) that start and use nodes
    "_runtime": [("messaging",), ("node",), ("logs",), ("hosting",)],
}


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
    tree = source_ast.parse(path.read_text())
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


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _run_time_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of ``tree`` but those under ``if TYPE_CHECKING:``."""
    out: list[ast.AST] = []
    todo = [tree]
    while todo:
        node = todo.pop()
        out.append(node)
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))
    return out


def _module_of(dotted: list[str]) -> list[str]:
    """``dotted`` if it names a danaus module or package, else its parent (an attribute)."""
    here = SRC.joinpath(*dotted[1:])
    if here.is_dir() or here.with_suffix(".py").is_file():
        return dotted
    return dotted[:-1]


def _imported_modules(path: pathlib.Path) -> set[str]:
    """The danaus modules ``path`` imports at run time (in functions too), dotted:
    ``from pkg import mod`` counts as ``pkg.mod``."""
    rel = path.relative_to(SRC).with_suffix("")
    package = ["danaus", *rel.parts[:-1]]
    tree = source_ast.parse(path.read_text())
    constants = _module_constants(tree)
    found: set[str] = set()
    for node in _run_time_nodes(tree):
        found.update(_named_modules(node, constants))
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                base = [*base, *(node.module.split(".") if node.module else [])]
            else:
                base = node.module.split(".") if node.module else []
            if base[:1] == ["danaus"]:
                found.update(".".join(_module_of([*base, a.name])) for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "danaus")
    return found


def _sublayer(dotted: str, layer: str) -> str | None:
    """The sub-layer of ``layer`` that module ``dotted`` belongs to (None: another layer,
    or the layer's package itself)."""
    parts = dotted.split(".")
    if parts[1:2] != [layer] or len(parts) < 3:
        return None
    return parts[2]


def _sublayer_files() -> list[tuple[str, pathlib.Path]]:
    return [
        (layer, f)
        for layer in SUBLAYERS
        for f in sorted((SRC / layer).rglob("*.py"))
        if f.parent != SRC / layer or f.name != "__init__.py"
    ]


@pytest.mark.parametrize(
    ("layer", "path"),
    _sublayer_files(),
    ids=lambda v: str(v.relative_to(SRC)) if isinstance(v, pathlib.Path) else v,
)
def test_sublayers_import_only_their_own_and_earlier_ones(layer: str, path: pathlib.Path) -> None:
    groups = SUBLAYERS[layer]
    rank = {name: i for i, group in enumerate(groups) for name in group}
    dotted = ".".join(["danaus", *path.relative_to(SRC).with_suffix("").parts])
    mine = _sublayer(dotted, layer)
    assert mine in rank, f"{path.relative_to(SRC)}: add its sub-layer {mine!r} to SUBLAYERS"
    wrong = sorted(
        m
        for m in _imported_modules(path)
        if (sub := _sublayer(m, layer)) is not None
        and sub != mine
        and (sub not in rank or rank[sub] >= rank[mine])
    )
    assert not wrong, f"{path.relative_to(SRC)} ({mine}) imports later or peer sub-layers: {wrong}"


def test_the_sublayer_scan_sees_deferred_and_from_imports_but_not_type_checking_ones() -> None:
    path = SRC / "_actor" / "core" / "context.py"
    found = _imported_modules(path)
    assert "danaus._actor.core.failing" in found  # from .failing import Aborted
    assert "danaus._runtime.node" in found  # from ..._runtime.node import this_node
    assert not any(m.startswith("danaus._actor.api") for m in found)  # TYPE_CHECKING only
    deferred = _imported_modules(SRC / "_bootstrap.py")
    assert {"danaus._tensor.api", "danaus._observe.dashboard"} <= deferred  # inside functions


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
        "get_rdma_local_path",
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
        "DEFAULT_JOB_PATH",
        "JobState",
        "JobTrait",
        "LocalJob",
        "MeshAdminConfig",
        "ProcessJob",
        "SSHJob",
        "SlurmError",
        "SlurmJob",
        "PortForwarder",
        "StartedWorker",
        "exec_command",
        "TelemetryConfig",
        "hosts_from_config",
        "job_load",
        "job_loads",
        "load_current_job",
        "set_current_job",
        "shell",
    ],
    "danaus.mesh_controller": ["DeviceMesh", "RemoteException", "spawn_tensor_engine"],
    "danaus.tools.config": ["NOT_SET", "Config", "Workspace"],
    "danaus.tools.commands": [
        "DEFAULT_JOB_PATH",
        "MONARCH_DIR",
        "apply_job",
        "context_create",
        "context_ls",
        "context_rm",
        "context_use",
        "create",
        "exec_on_job",
        "get_or_create",
        "info",
        "kill",
        "kill_and_confirm",
        "load_current_job",
        "server_ready",
        "shell_on_job",
    ],
    "danaus.tools.mesh_spec": [
        "DEFAULT_REMOTE_ALLOCATOR_PORT",
        "AppState",
        "MeshSpec",
        "ServerSpec",
        "mesh_spec_from_metadata",
        "tag_as_metadata",
    ],
    "danaus.tools.network": ["AddrType", "get_ipaddr", "get_sockaddr"],
    "danaus.spmd": ["SPMDActor", "setup_torch_elastic_env", "setup_torch_elastic_env_async"],
    "danaus.config": [
        "Encoding",
        "NoEffectWarning",
        "SETTINGS",
        "Setting",
        "clear_runtime_config",
        "configure",
        "configured",
        "get_global_config",
        "get_runtime_config",
        "parametrize_config",
        "parametrize_config_pointwise",
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
    "danaus.telemetry": ["MetricsServer", "QueryError", "query", "serve_metrics"],
    "danaus.supervisor": ["Backoff", "Restart", "Supervisor"],
    "danaus.timer": [
        "ExecutionTimer",
        "execution_timer_start",
        "execution_timer_stop",
        "get_execution_timer_average_ms",
        "get_latest_timer_measurement",
    ],
    "danaus.gradient": ["GradientGenerator"],
    "danaus.gradient_generator": [
        "GradFunction",
        "GradGenerator",
        "TensorOrEdge",
        "grad_function",
        "grad_generator",
        "gradient_execution_order",
    ],
    "danaus": [
        "ActorFuture",
        "DanausError",
        "Extent",
        "Future",
        "NDSlice",
        "OpaqueRef",
        "Point",
        "RemoteProcessGroup",
        "RemoteTensorError",
        "Selection",
        "Shape",
        "Simulator",
        "Slice",
        "Stream",
        "Tensor",
        "builtins",
        "call_on_shard_and_fetch",
        "coalescing",
        "clear_runtime_config",
        "configure",
        "configured",
        "fetch_shard",
        "function_resolvers",
        "get_active_mesh",
        "get_active_stream",
        "get_global_config",
        "get_runtime_config",
        "grad_function",
        "grad_generator",
        "inspect",
        "no_mesh",
        "reduce",
        "reduce_",
        "remote",
        "set_meta",
        "show",
        "slice_mesh",
        "stats",
        "timer",
        "to_mesh",
        "trace",
    ],
    "danaus.actor": [
        "Accumulator",
        "Actor",
        "ActorError",
        "ActorMesh",
        "BootstrapCommand",
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
        "ProcId",
        "ProcMesh",
        "SupervisionError",
        "Uid",
        "ValueMesh",
        "as_endpoint",
        "attach",
        "attach_to_workers",
        "concurrent_endpoint",
        "config",
        "context",
        "current_actor_name",
        "current_rank",
        "current_size",
        "debug_controller",
        "default_bootstrap_cmd",
        "enable_transport",
        "endpoint",
        "get_meter",
        "get_or_spawn_controller",
        "local_proc_mesh",
        "proc_mesh",
        "hosts_from_config",
        "run_worker_loop_forever",
        "send",
        "shutdown_context",
        "sim_proc_mesh",
        "span",
        "this_host",
        "this_proc",
        "traced",
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
# tests/monarch_names.json holds the ``__all__`` lists of Monarch's public modules at a
# recorded commit of its main branch (``scripts/monarch-names snapshot MONARCH``);
# docs/monarch-differences.md's table of names danaus lacks is generated from it.
MONARCH_NAMES = json.loads((SRC.parents[1] / "tests" / "monarch_names.json").read_text())
MONARCH_NAMES_SCRIPT = SRC.parents[1] / "scripts" / "monarch-names"

# Names older Monarch programs import that Monarch no longer exports (issue 16).
MONARCH_OLDER = {
    "monarch.actor": ["local_proc_mesh", "proc_mesh", "sim_proc_mesh"],
    "monarch.rdma": ["gpu_direct_rdma_supported"],
}

DIFFERENCES = SRC.parents[1] / "docs" / "monarch-differences.md"


def _documented_names() -> set[str]:
    """The names in the table of the differences document's "not yet available" section."""
    text = DIFFERENCES.read_text()
    section = text.split("## Names not yet available", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    return {name for row in rows for name in re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", row)}


def _danaus_module(monarch_module: str) -> str:
    return monarch_module.replace("monarch", "danaus", 1)


@pytest.mark.parametrize("module", sorted(MONARCH_NAMES["modules"]))
def test_every_monarch_name_has_a_danaus_counterpart_or_a_documented_reason(module: str) -> None:
    danaus_mod = importlib.import_module(_danaus_module(module))
    documented = _documented_names()
    names = MONARCH_NAMES["modules"][module]
    missing = [n for n in names if not hasattr(danaus_mod, n) and n not in documented]
    assert not missing, (
        f"{module} exports {missing}, which {danaus_mod.__name__} lacks; add them or give the "
        "reason in scripts/monarch-missing-names.json and run scripts/monarch-names table"
    )


@pytest.mark.parametrize("module", sorted(MONARCH_OLDER))
def test_names_older_monarch_programs_import_still_exist(module: str) -> None:
    danaus_mod = importlib.import_module(_danaus_module(module))
    assert [n for n in MONARCH_OLDER[module] if not hasattr(danaus_mod, n)] == []


def test_the_table_of_monarch_names_danaus_lacks_is_current() -> None:
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, str(MONARCH_NAMES_SCRIPT), "table", "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_importing_danaus_and_its_actor_core_never_imports_torch() -> None:
    import subprocess
    import sys

    code = (
        "import sys, danaus, danaus.actor, danaus.rdma, danaus.job; "
        "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if 'torch' in m)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_client_node_loads_the_tensor_engine_dashboard_and_debugger_only_on_use() -> None:
    """The bootstrap installs their hooks on the node, but imports none of them: the
    tensor engine needs torch, the dashboard only runs with DANAUS_DASHBOARD=1, and the
    client never needs the proc side of the debugger (pdb)."""
    import os
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from danaus.actor import context, shutdown_context\n"
        "context()  # starts the client's node: the bootstrap runs\n"
        "assert 'danaus._bootstrap' in sys.modules\n"
        "late = ['torch', 'danaus._tensor.api', 'danaus._observe.dashboard', "
        "'danaus._actor.debugger.remote', 'danaus._actor.debugger.controller', 'pdb']\n"
        "assert not [m for m in late if m in sys.modules], [m for m in late if m in sys.modules]\n"
        "shutdown_context().get()\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "DANAUS_DASHBOARD"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=60)


def test_importing_danaus_and_its_actor_core_never_imports_opentelemetry() -> None:
    """Telemetry is an extra (danaus[telemetry]): the core loads without it, and
    imports it only once a span is made or telemetry is turned on."""
    import subprocess
    import sys

    code = (
        "import sys, danaus, danaus.actor, danaus.rdma, danaus.job; "
        "assert not [m for m in sys.modules if m.startswith('opentelemetry')], "
        "sorted(m for m in sys.modules if m.startswith('opentelemetry'))"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_imports_by_name_are_seen(tmp_path: pathlib.Path) -> None:
    """An ``importlib.import_module("danaus._x")`` counts as an import of ``_x``."""
    layer = tmp_path / "danaus" / "_runtime"
    layer.mkdir(parents=True)
    path = layer / "m.py"
    path.write_text('import importlib\nX = "danaus._bootstrap"\nimportlib.import_module(X)\n')
    old = globals()["SRC"]
    globals()["SRC"] = tmp_path / "danaus"
    try:
        assert "_bootstrap" in _danaus_imports(path)
    finally:
        globals()["SRC"] = old


def test_the_node_does_not_import_the_bootstrap_the_package_registers_it() -> None:
    assert "_bootstrap" not in _danaus_imports(SRC / "_runtime" / "node.py")
    assert "_bootstrap" in _danaus_imports(SRC / "__init__.py")


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
    for node in ast.walk(source_ast.parse(path.read_text())):
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
        "rt.observing.observers['x'] = f\nrt.set_tracer(None)\nself.rtx = rt\n"
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


# -- no import cycles, and no hidden imports inside functions ------------------------------


def _code_metrics() -> Any:
    """scripts/code-metrics, loaded as a module (its file has no ``.py`` suffix)."""
    import importlib.machinery
    import importlib.util

    path = SRC.parents[1] / "scripts" / "code-metrics"
    loader = importlib.machinery.SourceFileLoader("code_metrics", str(path))
    spec = importlib.util.spec_from_loader("code_metrics", loader)
    assert spec is not None
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


# Imports inside functions that stay, each for a reason: the bootstrap (above every
# layer) loads the tensor engine (needs torch), the dashboard and the debugger on first
# use; ``_cli`` keeps the command's start-up fast. Optional dependencies (torch, numpy,
# opentelemetry, torchshow, duckdb, prometheus_client, pytest for the config decorators)
# may be imported anywhere inside a function.
DEFERRED_ALLOWED = {"danaus._bootstrap"}
OPTIONAL = {
    "torch",
    "numpy",
    "uvloop",
    "msgspec",
    "opentelemetry",
    "torchshow",
    "pytest",
    "duckdb",
    "prometheus_client",
    "aiohttp",
}


def test_the_package_has_no_import_cycle_and_no_hidden_deferred_import() -> None:
    """The module import graph of danaus, deferred imports included, has no cycle (issue
    25: 4 cycles before, one of 27 modules); and no function imports a module except in
    the bootstrap, the CLI, or for an optional dependency: what runs first is plain."""
    cm = _code_metrics()
    modules = [cm.Module(SRC, p) for p in sorted(SRC.rglob("*.py"))]
    known = {m.name for m in modules}
    assert "danaus._tensor.tensor" in known and "danaus._actor.core.cell" in known
    graph = {m.name: cm.import_edges(m, known, True, []) for m in modules}
    cycles = [c for c in cm.tarjan(graph) if len(c) > 1]
    assert not cycles, f"import cycles: {cycles}"
    deferred = []
    for mod in modules:
        if mod.name in DEFERRED_ALLOWED or mod.name.startswith("danaus._cli."):
            continue
        for imp in cm.deferred_imports(mod):
            if imp["type_checking"]:
                continue
            node = source_ast.parse(imp["import"]).body[0]
            if isinstance(node, ast.ImportFrom):
                targets = [cm.resolve(mod, node.level, node.module)]
            else:
                targets = [alias.name for alias in node.names]
            if not all(t.split(".")[0] in OPTIONAL for t in targets):
                deferred.append(f"{mod.name}:{imp['line']}: {imp['import']}")
    assert not deferred, f"imports inside functions: {deferred}"


def test_the_cycle_check_sees_deferred_imports(tmp_path: pathlib.Path) -> None:
    """The check above would fail on a cycle closed by an import inside a function."""
    cm = _code_metrics()
    pkg = tmp_path / "danaus"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("def f():\n    from .a import x\n    return x\n")
    modules = [cm.Module(pkg, p) for p in sorted(pkg.rglob("*.py"))]
    known = {m.name for m in modules}
    graph = {m.name: cm.import_edges(m, known, True, []) for m in modules}
    assert [c for c in cm.tarjan(graph) if len(c) > 1] == [["danaus.a", "danaus.b"]]
    (b,) = [m for m in modules if m.name == "danaus.b"]
    assert [d["import"] for d in cm.deferred_imports(b)] == ["from .a import x"]


def test_the_top_level_all_is_strings_and_lists_every_tensor_engine_name() -> None:
    """The API docs read ``danaus.__all__`` as strings only (a starred name there failed
    the strict docs build), so the tensor engine's names are written out: kept in step."""
    import danaus
    from danaus._tensor import TOP_LEVEL

    assert all(isinstance(n, str) for n in danaus.__all__)
    assert set(TOP_LEVEL) <= set(danaus.__all__)
