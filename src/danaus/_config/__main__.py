"""``python -m danaus._config`` prints ``docs/config.md``'s tables."""

from __future__ import annotations

from .docs import markdown_table, monarch_markdown_table

if __name__ == "__main__":  # pragma: no cover
    print(markdown_table())
    print()
    print(monarch_markdown_table())
