"""``monarch`` as an alias of ``danaus``: for running Monarch's own tests only.

This directory is put on ``PYTHONPATH`` by ``scripts/monarch-conformance`` and
by nothing else; it is never installed. Importing ``monarch`` installs a
``sys.meta_path`` finder that answers ``monarch.X`` with the module
``danaus.X`` itself (the same object, so classes and pickles agree), then
replaces this module with ``danaus`` in ``sys.modules``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Sequence


class _Alias(importlib.abc.Loader):
    def __init__(self, target: types.ModuleType) -> None:
        self.target = target
        self.spec = target.__spec__

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return self.target

    def exec_module(self, module: types.ModuleType) -> None:
        module.__spec__ = self.spec  # the import system set it to monarch.X's; keep danaus's


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith("monarch."):
            return None
        name = "danaus" + fullname[len("monarch") :]
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name is not None and name.startswith(e.name):
                return None  # danaus has no such module: "No module named 'monarch.X'"
            raise
        return importlib.machinery.ModuleSpec(
            fullname, _Alias(module), is_package=hasattr(module, "__path__")
        )


if not any(isinstance(f, _Finder) for f in sys.meta_path):
    sys.meta_path.insert(0, _Finder())

import danaus  # noqa: E402

sys.modules[__name__] = danaus
