"""``python -m danaus._runtime.hosting.entry``: where a bootstrap command ends up.

A proc spawned with ``spawn_procs(bootstrap_command=...)`` runs this module
last, after whatever wrapped it; it reads its boot record from the file the
zygote's child left open for it (``command.main``). Kept apart from
``command`` so that running it as ``__main__`` never loads a second copy of
a module the proc also imports.
"""

from __future__ import annotations

if __name__ == "__main__":
    from danaus._runtime.hosting.command import main

    raise SystemExit(main())
