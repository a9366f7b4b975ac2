"""Print the oldest and the newest Python that ``requires-python`` allows and this machine
has: one interpreter path a line (one line if they are the same).

Looked for: ``python3.X`` on ``PATH`` and every ``pyenv`` version (``$PYENV_ROOT`` or
``~/.pyenv``). ``scripts/check-package`` installs the wheel into a venv of each.
"""

from __future__ import annotations

import glob
import os
import pathlib
import re
import shutil
import subprocess
import sys

from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = pathlib.Path(__file__).resolve().parents[1]


def candidates() -> set[str]:
    found = {sys.executable}
    for minor in range(6, 20):
        if path := shutil.which(f"python3.{minor}"):
            found.add(path)
    pyenv = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    found.update(glob.glob(os.path.join(pyenv, "versions", "*", "bin", "python3")))
    return found


def version(python: str) -> Version | None:
    try:
        out = subprocess.run(
            [python, "-c", "import platform, venv; print(platform.python_version())"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except OSError:
        return None
    return Version(out.stdout.strip()) if out.returncode == 0 else None


def main() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()  # no tomllib on 3.10
    m = re.search(r'^requires-python = "([^"]+)"', pyproject, re.M)
    assert m, "pyproject.toml has no requires-python"
    spec = SpecifierSet(m.group(1))
    allowed: dict[Version, str] = {}
    for python in sorted(candidates()):
        v = version(python)
        if v is not None and v in spec and not v.is_prerelease:
            allowed.setdefault(v, python)
    if not allowed:
        return
    order = sorted(allowed)
    for v in dict.fromkeys([order[0], order[-1]]):
        print(allowed[v])


if __name__ == "__main__":
    main()
