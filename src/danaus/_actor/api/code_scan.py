"""Code sync's local side: the files of a workspace's directories, their digests, and
what changed since the last sync (``code_sync.py`` sends it)."""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

_SKIP_DIRS = {"__pycache__"}
_SKIP_SUFFIXES = (".pyc", ".pyo")


class Dirs(Protocol):
    """A workspace as the scan reads it (``code_sync.Workspace``): its directories, each
    with its remote name, and whether symbolic links are followed."""

    dirs: dict[Path, str]
    follow_symlinks: bool


def _file_mode(mode: int) -> int:
    """The mode a synced file gets: its permission bits, less group/other write and set-id."""
    return stat.S_IMODE(mode) & 0o755


def _within(path: str, real_top: str) -> bool:
    real = os.path.realpath(path)
    return real == real_top or real.startswith(real_top.rstrip(os.sep) + os.sep)


def _files(
    top: Path, follow_symlinks: bool = False, skipped: list[str] | None = None
) -> Iterator[tuple[str, Path, os.stat_result]]:
    """``(relative posix path, path, stat)`` of every regular file under ``top``
    (caches skipped; one ``stat`` per file). A symbolic link is followed if its
    target lies inside ``top`` or ``follow_symlinks``; otherwise its relative path
    goes to ``skipped``. A directory already being walked (a link back up) is not
    walked again."""
    real_top = os.path.realpath(top)

    def walk(
        d: str, prefix: str, above: frozenset[tuple[int, int]]
    ) -> Iterator[tuple[str, Path, os.stat_result]]:
        try:
            entries = sorted(os.scandir(d), key=lambda e: e.name)
        except (FileNotFoundError, NotADirectoryError):
            return
        for e in entries:
            if e.is_symlink() and not follow_symlinks and not _within(e.path, real_top):
                if skipped is not None:
                    skipped.append(f"{prefix}{e.name}")
                continue
            if e.is_dir():
                if e.name in _SKIP_DIRS:
                    continue
                try:
                    st = e.stat()
                except OSError:
                    continue
                key = (st.st_dev, st.st_ino)
                if key not in above:
                    yield from walk(e.path, f"{prefix}{e.name}/", above | {key})
            elif not e.name.endswith(_SKIP_SUFFIXES):
                try:
                    st = e.stat()
                except FileNotFoundError:  # removed meanwhile, or a dangling link
                    continue
                if stat.S_ISREG(st.st_mode):
                    yield f"{prefix}{e.name}", Path(e.path), st

    try:
        top_st = os.stat(top)
    except OSError:
        return
    yield from walk(str(top), "", frozenset({(top_st.st_dev, top_st.st_ino)}))


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


@dataclass
class _Local:
    """One local directory, scanned: relative path -> (hash, mode, path)."""

    src: Path
    dst: str
    files: dict[str, tuple[str, int, Path]] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)  # links left out


def check_dirs(workspace: Dirs) -> None:
    """Raise ``ValueError`` for a missing directory or two that would overlap on the hosts."""
    for src in workspace.dirs:
        if not src.is_dir():
            raise ValueError(
                f"workspace directory {str(src)!r} does not exist or is not a directory"
            )
    dsts = list(workspace.dirs.values())
    for i, a in enumerate(dsts):
        for j, b in enumerate(dsts):
            if i != j and (a == b or a == "" or b.startswith(a + "/")):
                raise ValueError(
                    f"two workspace directories would overlap on the hosts ({a!r} and {b!r}); "
                    "give them distinct remote names: Workspace(dirs={src: name, ...})"
                )


def _scan(workspace: Dirs, known: dict[str, tuple[int, int, str]]) -> list[_Local]:
    """Hash every file; ``known`` (path -> mtime_ns, size, hash) spares rehashing unchanged ones."""
    check_dirs(workspace)
    out = []
    for src, dst in workspace.dirs.items():
        local = _Local(src, dst)
        for rel, path, st in _files(src, workspace.follow_symlinks, local.skipped):
            key = str(path)
            seen = known.get(key)
            if seen is not None and seen[:2] == (st.st_mtime_ns, st.st_size):
                digest = seen[2]
            else:
                digest = _digest(path)
                known[key] = (st.st_mtime_ns, st.st_size, digest)
            local.files[rel] = (digest, _file_mode(st.st_mode), path)
        out.append(local)
    return out


def _module_name(rel: str) -> str | None:
    """The module a file of a ``sys.path`` directory defines (``pkg/m.py`` -> ``pkg.m``)."""
    if not rel.endswith(".py"):
        return None
    parts = rel[: -len(".py")].split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    if not parts or not all(p.isidentifier() for p in parts):
        return None
    return ".".join(parts)
