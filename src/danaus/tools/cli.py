"""``danaus.tools.cli``: Monarch's ``monarch.tools.cli`` entry point, the ``danaus``
command (``apply``, ``exec``, ``shell``, ``kill``, ``context``, ...).

Example::

    from danaus.tools.cli import main

    main(["context", "ls"])
"""

from __future__ import annotations

import sys

from .._cli.main import build_parser as get_parser
from .._cli.main import main as _main

__all__ = ["get_parser", "main"]


def main(argv: list[str] | None = None) -> None:
    """Run the ``danaus`` command with ``argv`` (default: this process's); exits with its
    code when that is not 0, as Monarch's ``main``."""
    code = _main(sys.argv[1:] if argv is None else argv)
    if code:
        sys.exit(code)
