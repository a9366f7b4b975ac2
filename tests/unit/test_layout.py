"""The unit tests show the layers: every layer has ``tests/unit/<layer>/`` with tests, a
unit test of a layer imports no higher layer, and no unit test starts a process or
sleeps (the guard in ``tests/unit/conftest.py``)."""

from __future__ import annotations

import ast
import asyncio
import multiprocessing
import os
import pathlib
import re
import subprocess
import threading
import time
from types import SimpleNamespace

import pytest

import source_ast

from .conftest import Guard, NotAUnitTest

UNIT = pathlib.Path(__file__).resolve().parent
TESTS = UNIT.parent
SRC = TESTS.parent / "src" / "danaus"


def _layers() -> list[str]:
    """``LAYERS`` of tests/test_layers.py (the architecture's layer list, in order)."""
    tree = source_ast.parse((TESTS / "test_layers.py").read_text())
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and [getattr(t, "id", "") for t in stmt.targets] == [
            "LAYERS"
        ]:
            return list(ast.literal_eval(stmt.value))
    raise AssertionError("tests/test_layers.py defines no LAYERS list")


LAYERS = _layers()
# A layer's unit tests live in tests/unit/<its name without the underscore>/.
LAYER_DIRS = {layer.lstrip("_"): layer for layer in LAYERS}
# Sub-layers with a directory of their own (the runtime's message path).
SUBLAYER_DIRS = {"messaging": "_runtime"}

# Added by the refactor of issue 39 (helpers ``cell`` and ``runtime``, on their own
# branches): once those branches are merged, empty this set, so that these directories
# are held to the same rule as the others.
ADDED_BY_THE_REFACTOR: set[str] = set()  # actor, messaging and runtime have landed


def _test_files(d: pathlib.Path) -> list[pathlib.Path]:
    return sorted(p for p in d.rglob("test_*.py") if p.is_file())


def _tests_in(path: pathlib.Path) -> list[str]:
    tree = source_ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith(
            "test_"
        ):
            found.append(node.name)
    return found


def test_the_layer_list_is_the_architectures() -> None:
    assert LAYERS[:3] == ["_mesh", "_wire", "_transport"]
    assert all((SRC / layer).is_dir() for layer in LAYERS), [
        layer for layer in LAYERS if not (SRC / layer).is_dir()
    ]


@pytest.mark.parametrize("name", sorted({*LAYER_DIRS, *SUBLAYER_DIRS}))
def test_every_layer_has_a_directory_of_unit_tests(name: str) -> None:
    d = UNIT / name
    if name in ADDED_BY_THE_REFACTOR and not d.exists():
        pytest.skip(f"tests/unit/{name}/ comes with the issue 39 refactor's branch")
    assert d.is_dir(), f"tests/unit/{name}/ is missing: write the unit tests of its layer there"
    tests = [t for f in _test_files(d) for t in _tests_in(f)]
    assert tests, f"tests/unit/{name}/ holds no test"


def test_no_directory_of_unit_tests_names_something_that_is_not_a_layer() -> None:
    known = {*LAYER_DIRS, *SUBLAYER_DIRS}
    dirs = {p.name for p in UNIT.iterdir() if p.is_dir() and not p.name.startswith(("_", "."))}
    assert dirs <= known, f"not a layer: {sorted(dirs - known)} (layers: {sorted(known)})"


def _imported_layers(path: pathlib.Path) -> set[str]:
    """The ``danaus._<layer>`` layers ``path`` imports (anywhere in the file)."""
    found = set()
    for node in ast.walk(source_ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "danaus" and len(parts) > 1 and parts[1] in LAYERS:
                found.add(parts[1])
    return found


def test_a_unit_test_of_a_layer_imports_no_higher_layer() -> None:
    """What a layer's tests import shows what the layer stands on: its own layer and the
    ones below it (public facades, which sit above everything, are not counted)."""
    wrong = {}
    for name in sorted({*LAYER_DIRS, *SUBLAYER_DIRS}):
        d = UNIT / name
        if not d.is_dir():
            continue
        layer = LAYER_DIRS.get(name) or SUBLAYER_DIRS[name]
        allowed = set(LAYERS[: LAYERS.index(layer) + 1])
        for path in sorted(d.rglob("*.py")):
            higher = _imported_layers(path) - allowed
            if higher:
                wrong[str(path.relative_to(TESTS))] = sorted(higher)
    assert not wrong, f"unit tests importing a higher layer than their own: {wrong}"


def test_the_default_run_collects_the_unit_tests() -> None:
    """``./scripts/test`` (pytest with pyproject's settings) reaches tests/unit: a test
    path above it, and no ``--ignore``/``norecursedirs`` that leaves it out."""
    text = (TESTS.parent / "pyproject.toml").read_text()
    section = text.split("[tool.pytest.ini_options]", 1)[1].split("\n[", 1)[0]
    m = re.search(r"^testpaths\s*=\s*\[(.*?)\]", section, re.M | re.S)
    assert m, "pyproject.toml's [tool.pytest.ini_options] names no testpaths"
    paths = [pathlib.Path(p) for p in re.findall(r'"([^"]+)"', m.group(1))]
    unit = UNIT.relative_to(TESTS.parent)
    assert any(unit == p or p in unit.parents for p in paths), paths
    m = re.search(r'^addopts\s*=\s*"(.*)"', section, re.M)
    opts = m.group(1).split() if m else []
    leaving_out = [
        f"{a} {b}"
        for a, b in zip(opts, [*opts[1:], ""], strict=True)
        if a.split("=")[0] in ("--ignore", "--ignore-glob", "--deselect") and "unit" in (a + b)
    ]
    assert not leaving_out, f"pyproject.toml's addopts leave tests/unit out: {leaving_out}"
    m = re.search(r"^norecursedirs\s*=\s*(.*)$", section, re.M)
    assert not (m and "unit" in m.group(1)), "norecursedirs leaves tests/unit out"


# -- the guard ------------------------------------------------------------------------


def _refused(guard: Guard, call: object) -> str:
    """Call ``call()``; the guard's message (and forget it, so this test passes)."""
    with pytest.raises(NotAUnitTest) as info:
        call()  # type: ignore[operator]
    assert guard.seen == [str(info.value)]
    guard.seen.clear()
    return str(info.value)


def test_a_unit_test_that_starts_a_process_fails(_in_this_process_only: Guard) -> None:
    guard = _in_this_process_only
    assert "Popen._execute_child" in _refused(guard, lambda: subprocess.run(["true"]))
    assert "fork" in _refused(guard, os.fork)
    assert "system" in _refused(guard, lambda: os.system("true"))
    assert "tests/integration" in _refused(guard, lambda: os.popen("true"))
    proc = multiprocessing.get_context("spawn").Process(target=print)
    assert "start" in _refused(guard, proc.start)


def test_a_unit_test_that_sleeps_fails(_in_this_process_only: Guard) -> None:
    guard = _in_this_process_only
    assert "time.sleep(0.5)" in _refused(guard, lambda: time.sleep(0.5))
    assert "asyncio.sleep" in _refused(guard, lambda: asyncio.run(asyncio.sleep(0.5)))
    time.sleep(0)  # yielding is not waiting
    asyncio.run(asyncio.sleep(0))


def test_a_thread_the_test_started_is_held_to_the_same_rule(_in_this_process_only: Guard) -> None:
    guard = _in_this_process_only
    errors: list[BaseException] = []

    def run() -> None:
        try:
            subprocess.run(["true"])
        except BaseException as e:
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert [type(e) for e in errors] == [NotAUnitTest]
    assert len(guard.seen) == 1  # caught by the code under test, still failing the test
    guard.seen.clear()


def test_threads_that_ran_before_the_test_are_not_the_tests(_in_this_process_only: Guard) -> None:
    guard = _in_this_process_only
    go, done = threading.Event(), threading.Event()
    slept: list[bool] = []

    def run() -> None:
        go.wait()
        time.sleep(1e-6)  # a node's thread from another suite, say
        slept.append(True)
        done.set()

    t = threading.Thread(target=run)
    t.start()
    guard.others.add(t)
    go.set()
    assert done.wait(30)
    t.join()
    assert slept == [True] and guard.seen == []


def test_a_wider_scoped_fixture_that_starts_a_process_fails_what_uses_it(
    _in_this_process_only: Guard,
) -> None:
    from . import conftest

    setup = conftest.pytest_fixture_setup(SimpleNamespace(scope="module", argname="procs"), None)
    next(setup)  # the fixture's function runs now
    with pytest.raises(NotAUnitTest, match="Popen"):
        subprocess.run(["true"])
    with pytest.raises(pytest.fail.Exception, match=r"fixture 'procs': Popen\._execute_child"):
        setup.send("the fixture's value")
    assert _in_this_process_only.seen == []  # the fixture's guard saw it, not the test's
    plain = conftest.pytest_fixture_setup(SimpleNamespace(scope="session", argname="ok"), None)
    next(plain)
    with pytest.raises(StopIteration) as done:
        plain.send(42)
    assert done.value.value == 42  # a fixture that keeps to the rule gives its value
