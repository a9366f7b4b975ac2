"""The conformance table of Monarch's own tests (docs/monarch-conformance.md) stays true.

``scripts/monarch-conformance --write-docs`` runs Monarch's public-only test files
against danaus and records, per file, the Monarch names it imports and those
danaus lacked (``tests/monarch_conformance.json``). Without a Monarch checkout,
this test does the collection step that matters here: it imports every one of
those names through the ``monarch`` alias, in a fresh interpreter, and checks
that exactly the recorded ones are missing, and that the docs show the table
the script would write from that record.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import types

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = json.loads((ROOT / "tests" / "monarch_conformance.json").read_text())
ALIAS = ROOT / "scripts" / "monarch_conformance" / "alias"

_PROBE = r"""
import importlib, json, sys
out = {}
for item in json.loads(sys.argv[1]):
    module, _, name = item.partition(":")
    try:
        m = importlib.import_module(module)
    except ModuleNotFoundError as e:
        out[item] = e.name  # the Monarch module danaus lacks
        continue
    if not name or hasattr(m, name):
        out[item] = None
        continue
    try:
        importlib.import_module(f"{module}.{name}")
        out[item] = None
    except ModuleNotFoundError:
        out[item] = f"{module}.{name}"  # the Monarch name danaus lacks
print(json.dumps(out))
"""


def _script() -> types.ModuleType:
    path = ROOT / "scripts" / "monarch-conformance"
    loader = importlib.machinery.SourceFileLoader("monarch_conformance_script", str(path))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_monarch_is_not_importable_without_the_alias() -> None:
    probe = "import importlib.util; print(importlib.util.find_spec('monarch'))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert out.stdout.strip() == "None", "the monarch alias must never be on the default path"


def test_every_public_file_imports_exactly_what_the_table_says() -> None:
    items = sorted({i for f in RESULTS["public"].values() for i in f["imports"]})
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ALIAS), str(ROOT / "src")])
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(items)],
        capture_output=True,
        text=True,
        env=env,
        timeout=50,
    )
    assert out.returncode == 0, out.stderr
    errors = json.loads(out.stdout)
    stale = []
    for rel, row in RESULTS["public"].items():
        missing = sorted({errors[i] for i in row["imports"] if errors[i] is not None})
        if row["collected"] == "error" and row["missing"]:
            expected = sorted(row["missing"])
        elif row["collected"] == "error":
            continue  # fails to collect for another reason, which the table gives
        else:
            expected = []
        if not set(expected) <= set(missing) or (missing and not expected):
            stale.append(f"{rel}: the table says missing {expected}, now missing {missing}")
    assert not stale, (
        "docs/monarch-conformance.md is stale; re-run scripts/monarch-conformance MONARCH "
        "--write-docs:\n" + "\n".join(stale)
    )


def test_the_docs_show_the_recorded_table() -> None:
    script = _script()
    rows = list(RESULTS["public"].items())
    text = script.table(rows, RESULTS["private"], RESULTS["commit"])
    doc = (ROOT / "docs" / "monarch-conformance.md").read_text()
    assert f"{script.BEGIN}\n{text}{script.END}" in doc
    assert (
        RESULTS["commit"]
        == json.loads((ROOT / "tests" / "monarch_names.json").read_text())["commit"]
    )
