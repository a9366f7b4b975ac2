"""The type check is part of the test suite (issue 39): mypy over ``src/danaus`` and this folder.

``scripts/typecheck`` runs mypy as ``pyproject.toml`` configures it and holds
its errors to ``mypy-baseline.txt``, which may only shrink; the public faces
and ``endpoint_types.py`` (what users' code sees of endpoints) pass with no
error. mypy keeps its cache in ``.venv/.mypy_cache``: a first run on a fresh
clone checks everything (tens of seconds on a loaded machine), later ones
only what changed.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
MYPY_TIMEOUT = 300  # a cold cache checks all of src/danaus (about 11 s on an idle machine)


def _load_script() -> ModuleType:
    path = ROOT / "scripts" / "typecheck"
    loader = importlib.machinery.SourceFileLoader("danaus_typecheck_script", str(path))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


typecheck = _load_script()


@pytest.mark.timeout(MYPY_TIMEOUT)
def test_mypy_reports_only_baselined_errors_and_none_in_the_public_faces() -> None:
    errors = typecheck.run_mypy(typecheck.default_cache_dir())
    new, gone, forbidden = typecheck.compare([k for k, _ in errors], typecheck.read_baseline())
    assert not new, (
        "mypy found errors that tests/typecheck/mypy-baseline.txt does not hold; fix them "
        "(the baseline may only shrink):\n" + "\n".join(line for _, line in errors)
    )
    assert not gone, (
        "these baselined mypy errors are gone: delete their lines from "
        "tests/typecheck/mypy-baseline.txt (scripts/typecheck --shrink does):\n" + "\n".join(gone)
    )
    assert not forbidden, "the public faces and tests/typecheck must have no mypy error:\n" + (
        "\n".join(forbidden)
    )


@pytest.mark.timeout(MYPY_TIMEOUT)
def test_mypy_flags_a_wrong_argument_to_an_endpoint_adverb(tmp_path: Path) -> None:
    snippet = tmp_path / "user_program.py"
    snippet.write_text(
        textwrap.dedent(
            """
            from danaus.actor import Actor, Future, endpoint, this_host

            class Counter(Actor):
                @endpoint
                def incr(self, by: int) -> int:
                    return by

            mesh = this_host().spawn_procs(per_host={"gpus": 1}).spawn("c", Counter)
            fine: Future[int] = mesh.incr.call_one(1)
            mesh.incr.call_one("one")
            mesh.incr.call(by=1, extra=2)
            """
        )
    )
    errors = typecheck.run_mypy(typecheck.default_cache_dir(), [str(snippet)])
    # By file name: mypy may report the errors of an unchanged module under the path its
    # cache recorded (another run's tmp_path).
    ours = [key.split(": ", 1) for key, _ in errors]
    messages = [message for path, message in ours if Path(path).name == snippet.name]
    assert messages == [
        'Argument 1 to "call_one" of "Endpoint" has incompatible type "str"; expected "int"  '
        "[arg-type]",
        'Unexpected keyword argument "extra" for "call" of "Endpoint"  [call-arg]',
    ], [line for _, line in errors]


def test_the_baseline_comparison_fails_new_errors_gone_errors_and_public_face_errors() -> None:
    old = "src/danaus/_tensor/x.py: Name 'y' is not defined  [name-defined]"
    also = "src/danaus/_job/z.py: Incompatible return value  [return-value]"
    face = "src/danaus/actor/__init__.py: Incompatible types  [assignment]"
    assert typecheck.compare([old], [old, also]) == ([], [also], [])
    assert typecheck.compare([old, old], [old]) == ([old], [], [])
    assert typecheck.compare([old, face], [old]) == ([face], [], [face])
    assert typecheck.compare([old], [old, face]) == ([], [face], [face])
    lines = typecheck.read_baseline()
    assert all(": " in line and line.endswith("]") for line in lines), lines
