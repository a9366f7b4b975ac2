"""Run the Python code of the documentation, page by page, as a reader would paste it.

Each page (``docs/**/*.md`` and ``README.md``) is one program: its ``python``
blocks, in order, are pasted into one file and run in a fresh interpreter (one
per page, in an empty working directory). What each block prints is checked
against the output the page shows for it: a ``text`` block right after it (only
blank lines between), or one marked ``<!-- output -->`` further on.

Conventions, visible on the page:

- A block whose fence has a title, ````` ```python title="myjob.py" ````` , is a file
  of the program, not a step: it is written to that name in the working directory
  (later blocks import it) and counts as run.
- A block that is deliberately not runnable is preceded by a line
  ``**Not runnable here** (`NAME`): REASON``. It is skipped, and listed by
  ``page NAME: REASON`` in the summary; at most 5% of the blocks may be.

Expected output is matched line by line, with ``...`` standing for any text
within a line and a line of just ``...`` for any number of lines. Lines a proc
forwarded (they start with ``[``, or ``...[`` on the page where a count of similar
lines may stand before them) arrive asynchronously: they are matched by
content anywhere in the page's output, not by position.

Why our own runner rather than ``mktestdocs`` or ``pytest-markdown-docs``: both
execute blocks inside the pytest process (``exec``), which is not a fresh
interpreter per page (danaus keeps one client per process: a page that spawns
procs would leave them to the next), neither checks printed output against the
page, and neither has a visible skip with a reason.

``python tests/docrunner.py [PAGE ...]`` runs pages and prints the counts;
``tests/test_doc_blocks.py`` runs every page under pytest.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
FENCE = re.compile(r'^```(\w*)(?:\s+title="([^"]+)")?\s*$')
SKIP = re.compile(r"^\*\*Not runnable here\*\* \(`([\w.-]+)`\): (.{10,})$")
LAYOUT = re.compile(r"^\s*</?div\b")
SHELL = {"sh", "bash", "shell", "console"}
SENTINEL = "~~docs-block-end~~"
MAX_SKIPPED = 0.05
PAGE_TIMEOUT = 170.0


@dataclasses.dataclass
class Block:
    page: pathlib.Path
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    title: str | None = None  # a file of the program, written rather than run
    skip: tuple[str, str] | None = None  # (name, reason)
    expected: str | None = None  # the output the page shows for it

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def pages() -> list[pathlib.Path]:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def parse(page: pathlib.Path) -> list[Block]:
    """Every fenced block of ``page``; ``text`` output is attached to its python block."""
    lines = page.read_text().splitlines()
    found: list[Block] = []
    i = 0
    last_python: Block | None = None
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), None)
        if end is None:
            raise ValueError(f"{page}:{i + 1}: a code block that is never closed")
        # Layout lines (a side-by-side grid's <div>s) do not separate a marker from its block.
        before = [ln.strip() for ln in lines[:i] if ln.strip() and not LAYOUT.match(ln)]
        prev = before[-1] if before else ""
        block = Block(page, i + 1, m.group(1), "\n".join(lines[i + 1 : end]) + "\n", m.group(2))
        if (s := SKIP.match(prev)) is not None:
            block.skip = (s.group(1), s.group(2))
        if block.lang == "text" and last_python is not None and last_python.expected is None:
            right_after = prev == "```" and found and found[-1] is last_python
            if right_after or prev == "<!-- output -->":
                last_python.expected = block.code
        found.append(block)
        if block.lang in ("python", "py"):
            last_python = block
        elif block.lang not in ("text", ""):
            last_python = None
        i = end + 1
    return found


def python_blocks(page: pathlib.Path) -> list[Block]:
    return [b for b in parse(page) if b.lang in ("python", "py")]


@dataclasses.dataclass
class Result:
    page: pathlib.Path
    run: list[Block]
    skipped: list[Block]
    error: str | None = None


def _program(steps: list[Block]) -> tuple[str, list[tuple[int, Block, int]]]:
    """The page's program and, per line range, which block (and line in it) it came from."""
    out: list[str] = []
    spans: list[tuple[int, Block, int]] = []  # (first line of the program, block, fence line)
    for n, b in enumerate(steps):
        spans.append((len(out) + 1, b, b.line))
        out.extend(b.code.splitlines())
        out.append(f"print({SENTINEL!r}, {n}, flush=True)")
    return "\n".join(out) + "\n", spans


def _page_line(spans: list[tuple[int, Block, int]], lineno: int) -> str:
    for start, block, fence in reversed(spans):
        if lineno >= start:
            return f"{block.page.relative_to(ROOT)}:{fence + 1 + lineno - start}"
    return f"line {lineno}"


def _line_matches(pattern: str, line: str) -> bool:
    parts = [re.escape(p) for p in pattern.split("...")]
    return re.fullmatch(".*".join(parts), line.rstrip()) is not None


def _match(expected: list[str], actual: list[str]) -> bool:
    """``expected`` (with ``...`` wildcards) against ``actual``, line by line."""
    if not expected:
        return not actual
    head, rest = expected[0], expected[1:]
    if head.strip() == "...":
        return any(_match(rest, actual[k:]) for k in range(len(actual) + 1))
    return bool(actual) and _line_matches(head, actual[0]) and _match(rest, actual[1:])


def _forwarded(line: str) -> bool:
    """A line a proc printed (``[mesh {coords}] ...``, or ``[N similar lines] ...``); in the
    page's output, ``...[mesh ...`` also (the count of similar lines elided)."""
    return line.startswith("[") or line.startswith("...[")


def check_output(block: Block, own: list[str], everything: list[str]) -> str | None:
    """Why ``own`` (what the block printed) is not what the page shows, or None."""
    assert block.expected is not None
    want = block.expected.splitlines()
    want_local = [w for w in want if not _forwarded(w)]
    got_local = [g for g in own if not _forwarded(g)]
    problems = []
    if not _match(want_local, got_local):
        problems.append(
            "the page shows:\n  "
            + "\n  ".join(want_local)
            + "\nthe block printed:\n  "
            + "\n  ".join(got_local)
        )
    for w in want:
        if _forwarded(w) and not any(_line_matches(w, g) for g in everything):
            problems.append(f"no proc printed a line like {w!r}")
    if problems:
        return f"{block.where}: output differs from the page\n" + "\n".join(problems)
    return None


def run_page(page: pathlib.Path, timeout: float = PAGE_TIMEOUT) -> Result:
    blocks = python_blocks(page)
    skipped = [b for b in blocks if b.skip]
    steps = [b for b in blocks if not b.skip]
    result = Result(page, steps, skipped)
    if not steps:
        return result
    with tempfile.TemporaryDirectory(prefix="docs-") as tmp:
        work = pathlib.Path(tmp)
        for b in steps:
            if b.title:
                (work / b.title).write_text(b.code)
        program, spans = _program([b for b in steps if not b.title])
        script = work / f"{page.stem}_program.py"
        script.write_text(program)
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(work), *(p for p in sys.path if p)]),
            "PYTHONUNBUFFERED": "1",
        }
        try:
            r = subprocess.run(
                [sys.executable, script.name],
                cwd=work,
                capture_output=True,
                text=True,
                timeout=timeout,
                env=env,
            )
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            done = out.count(SENTINEL)
            runnable = [b for b in steps if not b.title]
            where = runnable[done].where if done < len(runnable) else "the end"
            result.error = f"{page.name}: did not finish in {timeout:.0f} s, in {where}"
            return result
        stderr = re.sub(
            rf'File "[^"]*{re.escape(script.name)}", line (\d+)',
            lambda m: f"File {_page_line(spans, int(m.group(1)))}",
            r.stderr,
        )
        # What each block printed: the stdout between its sentinel and the one before.
        chunks: list[list[str]] = [[]]
        for line in r.stdout.splitlines():
            if line.startswith(SENTINEL):
                chunks.append([])
            else:
                chunks[-1].append(line)
        everything = r.stdout.splitlines() + r.stderr.splitlines()  # procs' stderr too
        if r.returncode != 0:
            done = len(chunks) - 1
            runnable = [b for b in steps if not b.title]
            where = runnable[done].where if done < len(runnable) else "after the last block"
            result.error = (
                f"{page.relative_to(ROOT)}: the program failed (exit {r.returncode}) in the "
                f"block at {where}\n--- stdout (tail)\n{r.stdout[-2000:]}\n--- stderr (tail)\n"
                f"{stderr[-4000:]}"
            )
            return result
        problems = []
        for block, own in zip([b for b in steps if not b.title], chunks, strict=False):
            if block.expected is not None and (why := check_output(block, own, everything)):
                problems.append(why)
        if problems:
            result.error = "\n\n".join(problems)
    return result


def summary(results: list[Result]) -> str:
    run = sum(len(r.run) for r in results)
    skipped = [b for r in results for b in r.skipped]
    failed = [r for r in results if r.error]
    lines = [
        f"docs: {run} python blocks run, {len(skipped)} skipped, "
        f"in {len(results)} pages ({len(failed)} failed)"
    ]
    for b in skipped:
        assert b.skip is not None
        lines.append(f"  skipped {b.page.relative_to(ROOT)} {b.skip[0]}: {b.skip[1]}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    chosen = [pathlib.Path(a).resolve() for a in argv] or [p for p in pages() if python_blocks(p)]
    results = []
    for page in chosen:
        r = run_page(page)
        results.append(r)
        state = "FAILED" if r.error else "ok"
        print(f"{page.relative_to(ROOT)}: {len(r.run)} run, {len(r.skipped)} skipped, {state}")
        if r.error:
            print(r.error)
    print(summary(results))
    return 1 if any(r.error for r in results) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
