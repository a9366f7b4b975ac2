"""The mesh layer is pure: it imports only the standard library and itself."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import danaus._mesh as mesh_layer
import source_ast

LAYER_DIR = Path(mesh_layer.__file__).parent


def test_mesh_layer_imports_only_the_standard_library_and_itself() -> None:
    modules = sorted(LAYER_DIR.glob("*.py"))
    assert modules
    for path in modules:
        for node in ast.walk(source_ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            for name in names:
                top = name.partition(".")[0]
                assert top in sys.stdlib_module_names, f"{path.name} imports {name}"


def test_mesh_layer_exports_the_documented_names() -> None:
    assert sorted(mesh_layer.__all__) == [
        "Extent",
        "MeshTrait",
        "NDSlice",
        "Point",
        "Region",
        "Selection",
        "Shape",
        "Slice",
        "ValueMesh",
    ]
    assert "imports: nothing else from danaus" in (mesh_layer.__doc__ or "").lower()


def test_module_docstring_examples_run() -> None:
    import doctest
    import importlib

    names = {name: getattr(mesh_layer, name) for name in mesh_layer.__all__}
    for module_name in ("slice", "shape", "value_mesh"):
        module = importlib.import_module(f"danaus._mesh.{module_name}")
        result = doctest.testmod(module, extraglobs=names, report=False)
        assert result.attempted > 0, module_name
        assert result.failed == 0, module_name
