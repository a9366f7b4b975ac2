"""Every page's Python code runs as a reader pastes it, and prints what the page shows.

``tests/docrunner.py`` is the runner (one fresh interpreter per page, the blocks in
order); this module runs each page under pytest, and the terminal summary prints how
many blocks ran and which were skipped, and why.
"""

from __future__ import annotations

import pathlib

import pytest

from docrunner import MAX_SKIPPED, ROOT, Result, pages, parse, python_blocks, run_page

PAGES = [p for p in pages() if python_blocks(p)]
RESULTS: list[Result] = []  # read by the terminal summary (tests/conftest.py)


def test_the_docs_have_python_blocks_and_skip_at_most_five_percent() -> None:
    blocks = [b for p in PAGES for b in python_blocks(p)]
    skipped = [b.where for b in blocks if b.skip]
    assert len(blocks) >= 50
    assert len(skipped) <= MAX_SKIPPED * len(blocks), (
        f"{len(skipped)} of {len(blocks)} python blocks are skipped (at most "
        f"{MAX_SKIPPED:.0%}): {skipped}; make them part of their page's program"
    )


def test_no_snippet_includes_and_no_invisible_markers() -> None:
    """The README and pages show real code: no ``--8<--`` include, no HTML-comment
    marker a reader cannot see deciding what runs."""
    for page in pages():
        text = page.read_text()
        assert "--8<--" not in text, f"{page.relative_to(ROOT)}: a snippet include"
        assert "<!-- not runnable" not in text and "<!-- run -->" not in text, (
            f"{page.relative_to(ROOT)}: an invisible marker; write "
            "'**Not runnable here** (`name`): reason' before a block that cannot run"
        )


def test_shell_blocks_are_not_python() -> None:
    """A block that is Python is tagged python, so that the runner runs it."""
    for page in pages():
        for b in parse(page):
            if b.lang in ("sh", "bash", "shell", "console"):
                assert not b.code.lstrip().startswith(("import ", "from ")), b.where


@pytest.mark.timeout(200)
@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_page_runs_and_prints_what_it_shows(page: pathlib.Path) -> None:
    result = run_page(page)
    RESULTS.append(result)
    assert result.error is None, result.error
