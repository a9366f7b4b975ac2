"""Issue 39's figures of the code, for one tree or before and after (``code-metrics --before``).

Each figure is read from the source with ``ast`` (nothing is imported), except two
that need a tool: the repeated-code pairs (``duplicates``, when it is on PATH) and
the Python calls one ``call_one`` makes in the caller's thread (``--calls``: runs
``benchmarks/call_count.py`` of the working tree against each tree's ``src``).

Usage: scripts/code-metrics --before REV [--calls]
       python scripts/code_figures.py [TREE]          (one tree, default: the checkout)
"""

from __future__ import annotations

import ast
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from typing import Any

REPO = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = "danaus"


def _modules(src: pathlib.Path) -> Iterator[tuple[str, pathlib.Path, ast.Module]]:
    root = src / PACKAGE
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(src).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        yield ".".join(parts), path, ast.parse(path.read_text(), str(path))


def _classes(tree: ast.Module) -> Iterator[ast.ClassDef]:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            yield node


def _attributes(cls: ast.ClassDef) -> set[str]:
    """The distinct ``self.X`` assigned in the class's own methods."""
    names: set[str] = set()
    for node in ast.walk(cls):
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        for t in targets:
            for sub in ast.walk(t):
                if (
                    isinstance(sub, ast.Attribute)
                    and isinstance(sub.value, ast.Name)
                    and sub.value.id == "self"
                ):
                    names.add(sub.attr)
    return names


def _lines(node: ast.AST) -> int:
    return int(getattr(node, "end_lineno", 0)) - int(getattr(node, "lineno", 0)) + 1


def _called(node: ast.Call) -> str | None:
    f = node.func
    if isinstance(f, ast.Name):
        return f.id
    if isinstance(f, ast.Attribute):
        return f.attr
    return None


# The names the node has been looked up by: host.ensure_runtime/ensure_node/current_node,
# node.current() and proc.current() (the runtime's), and this_node(), which replaced them.
_LOOKUPS = {"ensure_runtime", "ensure_node", "current_node", "this_node"}
_LOOKUP_MODULES = {"_node", "node", "node_mod", "_proc", "proc"}  # X.current(): X is one


def _is_node_lookup(node: ast.Call) -> bool:
    name = _called(node)
    if name in _LOOKUPS:
        return True
    f = node.func
    return (
        name == "current"
        and isinstance(f, ast.Attribute)
        and isinstance(f.value, ast.Name)
        and f.value.id in _LOOKUP_MODULES
    )


def _imports(name: str, path: pathlib.Path, tree: ast.Module, known: set[str]) -> set[str]:
    """Every module of the package this one imports, at any depth, TYPE_CHECKING included."""
    is_pkg = path.name == "__init__.py"
    base = name.split(".") if is_pkg else name.split(".")[:-1]
    out: set[str] = set()

    def closest(mod: str) -> str | None:
        while mod and mod not in known:
            mod = mod.rpartition(".")[0]
        return mod or None

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == PACKAGE and (m := closest(alias.name)):
                    out.add(m)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = base[: len(base) - node.level + 1]
                mod = ".".join(anchor + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.split(".")[0] != PACKAGE:
                continue
            for alias in node.names:
                sub = f"{mod}.{alias.name}"
                target = sub if sub in known else closest(mod)
                if target:
                    out.add(target)
    out.discard(name)
    return out


def _sccs(graph: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(max(10000, sys.getrecursionlimit()))

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _duplicate_pairs(src: pathlib.Path) -> int | None:
    """Pairs of repeated code with both sides in src/, boilerplate left out (None: no tool)."""
    tool = shutil.which("duplicates")
    if tool is None:
        return None
    out = subprocess.run(
        [tool, "--repo", str(src), "--most", "200", "--seconds", "180"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    ).stdout
    rows = [ln for ln in out.splitlines() if re.match(r"D\d+ ", ln)]
    return sum("boilerplate" not in ln for ln in rows)


def _call_count(src: pathlib.Path) -> int | None:
    script = REPO / "benchmarks" / "call_count.py"
    if not script.exists():
        return None
    env = {**os.environ, "PYTHONPATH": str(src)}
    venv = REPO / ".venv" / "bin" / "python"  # the project's environment, for its dependencies
    res = subprocess.run(
        [str(venv) if venv.exists() else sys.executable, str(script), "--quiet"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    m = re.search(r"calls per call_one: (\d+)", res.stdout)
    return int(m.group(1)) if m else None


def measure(tree: pathlib.Path, *, calls: bool = False) -> dict[str, Any]:
    """The figures of one checkout (a directory holding ``src/`` and ``tests/``)."""
    src = tree / "src"
    mods = list(_modules(src))
    known = {name for name, _, _ in mods}
    f: dict[str, Any] = {}

    classes = [(name, c) for name, _, t in mods for c in _classes(t)]
    runtime = [c for m, c in classes if c.name == "Runtime" and ".messaging." in m]
    f["Runtime: lines"] = _lines(runtime[0]) if runtime else 0
    f["Runtime: attributes"] = len(_attributes(runtime[0])) if runtime else 0
    cell = [c for _, c in classes if c.name == "ActorCell"]
    f["ActorCell: lines"] = _lines(cell[0]) if cell else 0
    f["ActorCell: attributes"] = len(_attributes(cell[0])) if cell else 0
    f["ActorCell: base classes (mixins)"] = len(cell[0].bases) if cell else 0
    f["classes over 400 lines or 25 attributes"] = sum(
        _lines(c) > 400 or len(_attributes(c)) > 25 for _, c in classes
    )

    calls_of: dict[str, int] = {"ensure_runtime": 0, "ensure_node": 0}
    currents = 0
    lookups = 0  # every way there has been to look the node up, renamed or not
    for _, _, t in mods:
        for node in ast.walk(t):
            if isinstance(node, ast.Call) and _called(node) in calls_of:
                calls_of[str(_called(node))] += 1
            elif isinstance(node, ast.FunctionDef) and node.name == "current":
                currents += 1
            if isinstance(node, ast.Call) and _is_node_lookup(node):
                lookups += 1
    f["call sites of ensure_runtime"] = calls_of["ensure_runtime"]
    f["call sites of ensure_node"] = calls_of["ensure_node"]
    f["functions named current()"] = currents
    f["call sites of any node lookup (ensure_*, current_node, this_node, current)"] = lookups

    private_reads = 0
    for m, c in classes:
        if not c.name.endswith("Endpoint") or not m.startswith(f"{PACKAGE}._actor.api"):
            continue
        for node in ast.walk(c):
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
            ):
                private_reads += 1
    f["Endpoint: reads of another object's private field"] = private_reads

    wide = 0
    for _, _, t in mods:
        for node in ast.walk(t):
            if (
                isinstance(node, ast.Return)
                and isinstance(node.value, ast.Tuple)
                and len(node.value.elts) >= 4
            ):
                wide += 1
    f["returns of a tuple of 4 or more values"] = wide

    sizes = {name: len(path.read_text().splitlines()) for name, path, _ in mods}
    f["modules over 600 lines"] = sum(n > 600 for n in sizes.values())
    f["largest module (lines)"] = max(sizes.values())
    for pkg in (f"{PACKAGE}._config", f"{PACKAGE}._transport.conn"):
        parts = {k: v for k, v in sizes.items() if k == pkg or k.startswith(pkg + ".")}
        short = pkg.split(".", 1)[1]
        f[f"{short}: modules"] = len(parts)
        f[f"{short}: largest module (lines)"] = max(parts.values(), default=0)

    graph = {name: _imports(name, path, t, known) for name, path, t in mods}
    sccs = _sccs(graph)
    f["import cycles, TYPE_CHECKING included"] = len(sccs)
    f["largest import cycle (modules)"] = max((len(s) for s in sccs), default=0)

    tests = tree / "tests"
    f["tests/integration files"] = len(list((tests / "integration").glob("test_*.py")))
    unit = tests / "unit"
    f["layers with tests/unit/<layer>"] = (
        sum(1 for d in unit.iterdir() if d.is_dir() and any(d.rglob("test_*.py")))
        if unit.is_dir()
        else 0
    )
    f["repeated-code pairs in src/ (duplicates, boilerplate aside)"] = _duplicate_pairs(src)
    if calls:
        f["Python calls in the caller's thread per warm call_one"] = _call_count(src)
    return f


def checkout(rev: str, into: pathlib.Path) -> pathlib.Path:
    """``src/`` and ``tests/`` of ``rev`` under ``into`` (git archive, no work tree touched)."""
    data = subprocess.run(
        ["git", "-C", str(REPO), "archive", rev, "src", "tests"],
        capture_output=True,
        check=True,
    ).stdout
    tar_path = into / "tree.tar"
    tar_path.write_bytes(data)
    with tarfile.open(tar_path) as tar:
        tar.extractall(into, filter="data")
    return into


def before_after(rev: str, *, calls: bool = False) -> str:
    with tempfile.TemporaryDirectory(prefix="code-figures-") as tmp:
        old = measure(checkout(rev, pathlib.Path(tmp)), calls=calls)
    new = measure(REPO, calls=calls)
    width = max(len(k) for k in old | new)
    lines = [f"== issue 39 figures: {rev} -> working tree", f"  {'figure':<{width}} before    now"]
    for key in old | new:
        b, n = old.get(key, "-"), new.get(key, "-")
        lines.append(
            f"  {key:<{width}} {'-' if b is None else b!s:>6} {'-' if n is None else n!s:>6}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    target = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else REPO
    for k, v in measure(target, calls="--calls" in sys.argv).items():
        print(f"{k}: {v}")
