"""Every code block of the documentation site runs in a test or says why it cannot.

A fenced block tagged ``python``, ``sh`` or ``bash`` in ``docs/`` must be
preceded by ``<!-- run -->`` (this test runs it as a client script) or by
``<!-- not runnable: REASON -->``, or include only files of ``examples/`` that
a test runs. Untagged and ``text`` blocks are diagrams and output, not code.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
from dataclasses import dataclass

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
CODE = {"python", "py", "sh", "bash", "shell", "console"}
SNIPPET = re.compile(r'^--8<-- "([^"]+)"$')


@dataclass(frozen=True)
class Block:
    path: pathlib.Path
    line: int
    lang: str
    marker: str  # the HTML comment right before the fence, or ""
    code: str

    def __str__(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks() -> list[Block]:
    found = []
    for path in sorted(DOCS.rglob("*.md")):
        lines = path.read_text().splitlines()
        i = 0
        while i < len(lines):
            m = re.match(r"^```(\w*)\s*$", lines[i])
            if not m:
                i += 1
                continue
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            before = [ln for ln in lines[:i] if ln.strip()]
            marker = before[-1].strip() if before and before[-1].startswith("<!--") else ""
            found.append(Block(path, i + 1, m.group(1), marker, "\n".join(lines[i + 1 : end])))
            i = end + 1
    return found


CODE_BLOCKS = [b for b in blocks() if b.lang in CODE]


def _examples_run_by_tests() -> set[str]:
    tests = "\n".join(p.read_text() for p in (ROOT / "tests").rglob("*.py"))
    return {p.name for p in (ROOT / "examples").glob("*.py") if p.name in tests}


def test_the_docs_have_code_blocks() -> None:
    assert len(CODE_BLOCKS) >= 5


@pytest.mark.parametrize("block", CODE_BLOCKS, ids=str)
def test_every_code_block_runs_in_a_test_or_says_why_not(block: Block) -> None:
    if block.marker == "<!-- run -->":
        assert block.lang == "python", f"{block}: only python blocks can be run"
        return
    m = re.fullmatch(r"<!-- not runnable: (.+) -->", block.marker)
    if m:
        assert len(m.group(1).strip()) > 10, f"{block}: give the reason"
        return
    includes = [SNIPPET.match(ln.strip()) for ln in block.code.splitlines() if ln.strip()]
    assert includes and all(includes), (
        f"{block}: mark the block '<!-- run -->' or '<!-- not runnable: REASON -->'"
    )
    run = _examples_run_by_tests()
    for inc in includes:
        assert inc is not None
        target = pathlib.Path(inc.group(1))
        assert target.parts[0] == "examples" and target.name in run, (
            f"{block} includes {target}, which no test runs"
        )


RUNNABLE = [b for b in CODE_BLOCKS if b.marker == "<!-- run -->"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("block", RUNNABLE, ids=str)
def test_runnable_code_blocks_run(block: Block, tmp_path: pathlib.Path) -> None:
    script = tmp_path / "block.py"
    script.write_text(block.code)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    r = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=110,
        env=env,
    )
    assert r.returncode == 0, f"{block} failed:\n{r.stderr[-3000:]}"
