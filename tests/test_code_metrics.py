"""scripts/code-metrics measures a tiny synthetic package as its sections define."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import textwrap

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "code-metrics"

FILES = {
    "__init__.py": "",
    "a.py": """
        import threading

        LIMIT = 8
        TABLE = {"x": 1}
        _lock = threading.Lock()
        _count = 0
        _cache = {}


        def bump():
            global _count
            _count += 1


        def use_b():
            from . import b

            return b.value()
    """,
    "b.py": """
        import threading
        from typing import TYPE_CHECKING

        if TYPE_CHECKING:
            from pkg import c


        class Box:
            def __init__(self):
                self.lock = threading.RLock()
                self.items = []
                self.items = []

            def add(self, x):
                self.size = len(self.items)


        def value():
            from .a import LIMIT

            return LIMIT


        def optional():
            import torch

            return torch
    """,
    "c.py": """
        import importlib

        from pkg import a


        def late():
            return importlib.import_module("pkg.b")
    """,
    "_cli/__init__.py": "",
    "_cli/main.py": """
        def main():
            import json

            return json
    """,
}


def _metrics(tmp_path: pathlib.Path) -> dict:
    root = tmp_path / "pkg"
    for name, text in FILES.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    out = subprocess.run(
        [sys.executable, str(SCRIPT), str(root), "--json"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return json.loads(out.stdout)


def test_code_metrics(tmp_path: pathlib.Path) -> None:
    m = _metrics(tmp_path)

    state = {(g["module"], g["name"]) for g in m["module_globals"]["items"]}
    assert state == {("pkg.a", "_count"), ("pkg.a", "_cache")}
    assert m["module_globals"]["rebound_with_global"] == 1
    assert m["module_locks"]["items"] == [{"module": "pkg.a", "name": "_lock"}]

    box = next(c for c in m["largest_classes"] if c["class"] == "Box")
    assert (box["attributes"], box["methods"], box["locks"]) == (3, 2, 1)
    assert box["lines"] == 8

    imports = m["imports_in_functions"]
    assert imports["count"] == 3  # _cli/ left out
    assert imports["count_without_optional_and_type_checking"] == 2  # torch left out
    assert imports["per_module"] == {"pkg.b": 2, "pkg.a": 1}

    # a -> b lazily, b -> a lazily: one cycle; c -> a, c -> b (import_module) but nothing
    # imports c at run time (b's import of c is under TYPE_CHECKING).
    graph = m["import_graph"]
    assert graph["scc_count"] == 1
    assert graph["sccs"] == [{"size": 2, "members": ["pkg.a", "pkg.b"]}]
    # With the TYPE_CHECKING import of c as an edge, b -> c -> a -> b closes one larger cycle.
    with_tc = m["import_graph_with_type_checking"]
    assert with_tc["scc_count"] == 1
    assert with_tc["sccs"] == [{"size": 3, "members": ["pkg.a", "pkg.b", "pkg.c"]}]
    assert with_tc["edges"] == graph["edges"] + 1


def test_code_metrics_text(tmp_path: pathlib.Path) -> None:
    _metrics(tmp_path)  # writes the package
    out = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path / "pkg")],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    assert "== module globals holding process state: 2" in out
    assert "== import cycles: 1 strongly connected components" in out
    assert "== import cycles with TYPE_CHECKING imports: 1 strongly connected" in out


FIGURE_TREE = {
    "src/danaus/__init__.py": "",
    "src/danaus/_runtime/__init__.py": "",
    "src/danaus/_runtime/messaging/__init__.py": "",
    "src/danaus/_runtime/messaging/runtime.py": """
        from typing import TYPE_CHECKING

        if TYPE_CHECKING:
            from danaus._actor.api.adverbs import Endpoint


        class Runtime:
            def __init__(self):
                self.a = 1
                self.b = 2


        def current():
            return ensure_runtime()


        def ensure_runtime():
            return Runtime()
    """,
    "src/danaus/_actor/__init__.py": "",
    "src/danaus/_actor/api/__init__.py": "",
    "src/danaus/_actor/api/adverbs.py": """
        from danaus._runtime.messaging.runtime import ensure_runtime


        class Endpoint:
            def call(self, mesh):
                ensure_runtime()
                return mesh._procs, self._name, mesh._shape

            def parts(self):
                return 1, 2, 3, 4
    """,
    "tests/integration/test_one.py": "",
    "tests/unit/wire/test_codec.py": "",
}


def test_code_figures_of_a_synthetic_tree(tmp_path: pathlib.Path) -> None:
    for rel, text in FIGURE_TREE.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import code_figures
    finally:
        sys.path.remove(str(SCRIPT.parent))
    f = code_figures.measure(tmp_path)
    assert f["Runtime: attributes"] == 2
    assert f["call sites of ensure_runtime"] == 2
    assert f["functions named current()"] == 1
    assert f["Endpoint: reads of another object's private field"] == 2  # self._name is its own
    assert f["returns of a tuple of 4 or more values"] == 1
    # the TYPE_CHECKING import closes a cycle that the runtime graph of code-metrics ignores
    assert f["import cycles, TYPE_CHECKING included"] == 1
    assert f["largest import cycle (modules)"] == 2
    assert f["tests/integration files"] == 1
    assert f["layers with tests/unit/<layer>"] == 1


def test_the_package_has_no_import_cycle_even_with_type_checking_imports() -> None:
    """Issue 39: the lower layer defines the Protocols it needs (``_runtime/messaging/
    faces.py``, ``_actor/core/owned.py``), so not even an annotation-only import closes
    a cycle. Names the modules of any cycle that comes back."""
    out = subprocess.run(
        [sys.executable, str(SCRIPT), str(SCRIPT.parents[1] / "src" / "danaus"), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    m = json.loads(out)
    assert m["import_graph"]["sccs"] == []
    assert m["import_graph_with_type_checking"]["sccs"] == [], (
        "an import cycle through TYPE_CHECKING imports: have the lower module define a "
        "Protocol of what it uses instead of importing the higher one"
    )
