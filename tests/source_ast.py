"""``ast.parse`` for the tests that read danaus's own source.

CPython 3.11 keeps the AST constructor's recursion depth in per-interpreter state, so an
``ast.parse`` in one thread can see another thread's parse move it (CPython issue
gh-106905; 3.11's traceback formatting parses source for its carets, so any thread that
formats a traceback counts). The parse then fails with ``SystemError: AST constructor
recursion depth mismatch`` although the source is fine. The unit tests start the client's
node in the test process, whose threads format tracebacks, so the tests that parse source
files parse through here: on that one error, and only that one, the parse is done again.
"""

from __future__ import annotations

import ast
from pathlib import Path


def parse(source: str, filename: str = "<unknown>") -> ast.Module:
    try:
        return ast.parse(source, filename)
    except SystemError as e:  # gh-106905: another thread's parse moved the shared depth
        if "recursion depth mismatch" not in str(e):
            raise
        return ast.parse(source, filename)


def parse_file(path: Path) -> ast.Module:
    return parse(path.read_text(), str(path))
