"""The README's example runs and prints what its comments say."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


@pytest.mark.timeout(120)
def test_the_readme_example_runs_and_prints_what_it_says(tmp_path: pathlib.Path) -> None:
    text = README.read_text()
    start = text.index("```python\nfrom danaus.actor import Actor, endpoint, this_host") + 10
    code = text[start : text.index("```", start)]
    script = tmp_path / "example.py"
    script.write_text(code)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    r = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=100, env=env
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines() == [
        "ValueMesh({gpus: 2}):",
        "  (({'gpus': 0/2}, 2), ({'gpus': 1/2}, 2))",
        "11",
    ]
