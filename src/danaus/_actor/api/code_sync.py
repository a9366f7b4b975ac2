"""Code sync: ``HostMesh.sync_workspace(Workspace(dirs=[...]))``.

The client's source directories are copied to every host of a mesh, under the
host's workspace root (the setting ``workspace_dir``), so that a user edits
locally and reruns without a shared file system:

    client                                  each host (one code-sync proc)
      hash every file of each directory
      --manifest(dsts)-------------------->  hash what root/dst holds (cached by mtime/size)
      <----------------{rel: sha256}-------
      --write(dst, changed files, deleted)->  write each file atomically, delete the others
      then every proc spawned through the mesh:
      --reload(dsts, changed)------------->  root/dst first on sys.path; changed modules
                                              that are imported are reloaded

Only files whose content hash differs travel, over the mesh's authenticated
connections (ordinary actor messages). Procs spawned later get ``root/dst`` on
``sys.path`` before any actor runs (a bootstrap the mesh adds).

What lands on a host goes first on its procs' ``sys.path``, so the rules of
``sys.path`` apply (``_runtime/hosting/proc.py``'s ``path_entry_problem``): the
workspace root, each ``root/dst`` and every directory written under it must
belong to the user or root and be writable by no one else (else
``PermissionError``, naming the directory and the fix; directories it creates
are 0755); files keep their mode without group and other write bits (and
without set-id bits). On the client, a symbolic link that leads out of its
workspace directory (``~/.ssh`` linked into a project) is left out, and listed
in the ``SyncReport``, unless ``Workspace(follow_symlinks=True)``; a link
inside it is followed (its target's content is sent under the link's name; a
link back to an ancestor is not walked twice). On the hosts, links are never
followed out of ``root/dst``, neither to report, write nor delete files.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import importlib
import importlib.util
import os
import secrets
import shutil
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from ... import _config as config
from ..._runtime.hosting.proc import path_entry_problem
from ..core.context import current_rank
from .actor import Actor
from .code_scan import _digest, _file_mode, _Local, _scan, _within
from .code_scan import _files as _files
from .code_scan import _module_name as _module_name
from .code_scan import check_dirs as check_dirs
from .endpoint import endpoint

__all__ = ["SyncReport", "Workspace", "check_private_dir", "workspace_root"]

_SKIP_DIRS = {"__pycache__"}
_SKIP_SUFFIXES = (".pyc", ".pyo")


class Workspace:
    """One or more local directories to mirror on the hosts (Monarch's ``Workspace``).

    ``Workspace(dirs=[Path("~/proj/trainer")])`` places the directory at
    ``ROOT/trainer`` on every host; ``Workspace(dirs={"~/proj/trainer": "code"})``
    names the remote directory (``""``: ``ROOT`` itself). ``ROOT`` is each
    host's setting ``workspace_dir``. ``env`` is accepted for Monarch
    compatibility; danaus does not sync environments (``conda=True`` raises).

    ``follow_symlinks`` (danaus's own): a symbolic link whose target lies
    outside its directory is left out unless ``True`` (a link to ``~/.ssh``
    would otherwise ship your keys to every host); links inside it are
    followed either way.
    """

    def __init__(
        self,
        dirs: Sequence[Path | str] | Mapping[Path | str, str] | None = None,
        env: Any = None,
        *,
        follow_symlinks: bool = False,
    ) -> None:
        if not isinstance(follow_symlinks, bool):
            raise TypeError(f"follow_symlinks must be True or False, got {follow_symlinks!r}")
        self.env = env
        self.follow_symlinks = follow_symlinks
        self.dirs: dict[Path, str] = {}
        if dirs is None:
            return
        if isinstance(dirs, (str, Path)):
            raise TypeError(f"dirs must be a list of directories (or a dict), got {dirs!r}")
        pairs = dirs.items() if isinstance(dirs, Mapping) else ((d, None) for d in dirs)
        for src, dst in pairs:
            if not src or not isinstance(src, (str, Path)):
                raise ValueError(f"a workspace directory must be a non-empty path, got {src!r}")
            path = Path(src).expanduser()
            name = path.resolve().name if dst is None else dst
            if not isinstance(name, str):
                raise TypeError(f"the remote name of {src!r} must be a str, got {name!r}")
            self.dirs[path] = _check_dst(name)

    @staticmethod
    def null() -> Workspace:
        """A workspace with no directories."""
        return Workspace()

    def merge(self, outdir: str | Path) -> None:
        """Copy the directories into ``outdir`` as they would be placed under a host's root
        (the files a sync sends, with the modes it gives them)."""
        out = Path(outdir)
        out.mkdir(parents=True, exist_ok=True)
        for src, dst in self.dirs.items():
            for rel, path, st in _files(src, self.follow_symlinks):
                target = out.joinpath(dst, *rel.split("/"))
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, target)
                os.chmod(target, _file_mode(st.st_mode))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Workspace) and (
            self.env,
            self.dirs,
            self.follow_symlinks,
        ) == (other.env, other.dirs, other.follow_symlinks)

    def __hash__(self) -> int:
        return hash((tuple(self.dirs.items()), self.follow_symlinks))

    def __repr__(self) -> str:
        return f"Workspace(dirs={ {str(k): v for k, v in self.dirs.items()}!r})"


def _check_dst(dst: str) -> str:
    p = PurePosixPath(dst)
    if p.is_absolute() or ".." in p.parts:
        raise ValueError(
            f"a workspace's remote directory is relative to the host's workspace root and "
            f"stays inside it; got {dst!r}"
        )
    return str(p) if dst else ""


def workspace_root() -> Path:
    """This host's workspace root: the setting ``workspace_dir``, else ~/.cache/danaus/workspace."""
    root = config.get("workspace_dir")
    if root:
        return Path(root).expanduser().absolute()
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "danaus" / "workspace"


def _remote_dir(dst: str) -> Path:
    return workspace_root() / dst if dst else workspace_root()


def check_private_dir(path: Path) -> None:
    """Raise ``PermissionError`` unless ``path`` (a directory of the workspace on this
    host) may hold code for ``sys.path``: the same rule as ``sys.path`` entries sent
    by a client (``path_entry_problem``), a missing directory aside."""
    problem = path_entry_problem(str(path))
    if problem is not None and problem != "it does not exist":
        raise PermissionError(
            f"refusing to use {str(path)!r} as a workspace directory: {problem}, so "
            "another user could plant a module that every proc of the job imports. "
            "Use a directory only you (or root) own and can write to (chmod go-w "
            f"{path}), or point the setting workspace_dir (DANAUS_WORKSPACE_DIR) at "
            "one; DANAUS_TRUST_SYS_PATH=1 accepts it anyway"
        )


def _make_private_dirs(path: Path) -> None:
    """Create ``path`` and its missing parents, each 0755 whatever the umask's group bits."""
    missing = []
    p = path
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(d, 0o755)


def _destination(dst: str) -> Path:
    """``ROOT/dst``, created if missing, after checking ``ROOT`` and it (see
    ``check_private_dir``)."""
    top = _remote_dir(_check_dst(dst))
    _make_private_dirs(top)
    root = workspace_root()
    check_private_dir(root)
    if top != root:
        check_private_dir(top)
    return top


def add_to_sys_path(dsts: Sequence[str]) -> list[str]:
    """Put ``ROOT/dst`` for each of ``dsts`` first on ``sys.path`` (once); returns them.

    A directory that does not exist (nothing synced there) is left out; one that
    another user owns or may write to raises ``PermissionError`` (``check_private_dir``),
    before ``sys.path`` changes."""
    paths = []
    for d in dsts:
        path = _remote_dir(d)
        check_private_dir(path)
        if path.is_dir():
            paths.append(str(path))
    for p in reversed(paths):
        if p in sys.path:
            sys.path.remove(p)
        sys.path.insert(0, p)
    importlib.invalidate_caches()
    return paths


def workspace_bootstrap(dsts: list[str], user: Callable[[], Any] | None) -> None:
    """The bootstrap of procs spawned after a sync: the workspace on ``sys.path``, then ``user``."""
    add_to_sys_path(dsts)
    if user is not None:
        user()


class CodeSyncActor(Actor):
    """One per host: reports and updates what the host's workspace root holds."""

    def __init__(self) -> None:
        self._hashes: dict[str, tuple[int, int, str]] = {}  # path -> (mtime_ns, size, sha256)

    def _hash(self, path: Path, st: os.stat_result) -> str:
        key = str(path)
        known = self._hashes.get(key)
        if known is not None and known[:2] == (st.st_mtime_ns, st.st_size):
            return known[2]
        h = _digest(path)
        self._hashes[key] = (st.st_mtime_ns, st.st_size, h)
        return h

    @endpoint
    def manifest(self, dsts: list[str]) -> tuple[str, dict[str, dict[str, str]]]:
        """``(root, {dst: {relative path: sha256}})`` of what this host holds (each
        ``ROOT/dst`` created and checked first: a refused one fails the sync at once)."""
        out: dict[str, dict[str, str]] = {}
        for dst in dsts:
            top = _destination(dst)
            out[dst] = {rel: self._hash(p, st) for rel, p, st in _files(top)}
        return str(workspace_root()), out

    @endpoint
    def write(
        self, dst: str, files: list[tuple[str, bytes, int]], deletes: list[str]
    ) -> tuple[int, int]:
        """Write ``files`` (relative path, content, mode) under ``ROOT/dst``, delete ``deletes``.

        Every directory written into is checked as ``ROOT/dst`` is, and must lie
        inside it once links are resolved; modes lose group/other write and set-id."""
        top = _destination(dst)
        real_top = os.path.realpath(top)
        written = 0
        made: set[Path] = {top}

        def checked_parent(path: Path, create: bool) -> None:
            if path.parent in made:
                return
            if create:
                _make_private_dirs(path.parent)
            if not _within(str(path.parent), real_top):
                raise PermissionError(
                    f"refusing to write {str(path)!r}: a symbolic link there leads out of "
                    f"the workspace directory {str(top)!r}"
                )
            check_private_dir(path.parent)
            made.add(path.parent)

        for rel, data, mode in files:
            path = _inside(top, rel)
            checked_parent(path, create=True)
            tmp = f"{path.parent}/.{path.name}.danaus-sync-{secrets.token_hex(4)}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fchmod(fd, _file_mode(mode))
                st = os.fstat(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)  # a rename keeps the mtime fstat saw
            if rel.endswith(".py"):  # a same-size edit within the second would keep the old .pyc
                with contextlib.suppress(OSError, ValueError, NotImplementedError):
                    os.remove(importlib.util.cache_from_source(str(path)))
            self._hashes[str(path)] = (st.st_mtime_ns, st.st_size, hashlib.sha256(data).hexdigest())
            written += 1
        for rel in deletes:
            path = _inside(top, rel)
            if not path.parent.is_dir():
                continue  # gone already
            checked_parent(path, create=False)
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            self._hashes.pop(str(path), None)
            with contextlib.suppress(OSError):  # emptied directories go too
                parent = path.parent
                while parent != top:
                    parent.rmdir()
                    parent = parent.parent
        return written, len(deletes)


def _inside(top: Path, rel: str) -> Path:
    p = PurePosixPath(rel)
    if p.is_absolute() or ".." in p.parts or not p.parts:
        raise ValueError(f"refusing a workspace path outside the workspace: {rel!r}")
    return top.joinpath(*p.parts)


class WorkspaceReloader(Actor):
    """On every proc of a mesh: the workspace on ``sys.path``, changed modules reloaded."""

    @endpoint
    def reload(self, dsts: list[str], changed: list[str]) -> list[tuple[str, str | None]]:
        """``[(module, error or None)]`` for each imported module among ``changed`` files."""
        add_to_sys_path(dsts)
        names = sorted({n for n in map(_module_name, changed) if n is not None})
        out: list[tuple[str, str | None]] = []
        for name in names:
            module = sys.modules.get(name)
            if module is None:
                continue
            try:
                importlib.reload(module)
                out.append((name, None))
            except Exception as e:
                where = ",".join(f"{k}={v}" for k, v in current_rank().items()) or "0"
                out.append((name, f"proc {where}: {type(e).__name__}: {e}"))
        return out


@dataclass(frozen=True)
class SyncReport:
    """What one ``sync_workspace`` did: files and bytes sent and deleted (summed over
    hosts), the hosts' workspace roots, the modules reloaded in running procs, and
    the local symbolic links left out because they lead out of their directory
    (``Workspace(follow_symlinks=True)`` sends what they point to)."""

    files_sent: int
    bytes_sent: int
    files_deleted: int
    roots: tuple[str, ...]
    reloaded: tuple[str, ...]
    skipped_links: tuple[str, ...] = ()


def sync(
    sync_actors: Any,
    proc_meshes: Sequence[Any],
    reloaders: dict[int, Any],
    workspace: Workspace,
    known: dict[str, tuple[int, int, str]],
) -> SyncReport:
    """Run one sync (blocking): ``sync_actors`` is the per-host ``CodeSyncActor`` mesh."""
    timeout = config.get("workspace_sync_timeout")
    batch_bytes = max(1, config.get("workspace_sync_batch_bytes"))
    dsts = list(workspace.dirs.values())
    asked = sync_actors.manifest.call(dsts)  # the hosts hash while this client does
    locals_ = _scan(workspace, known)
    manifests = asked.get(timeout=timeout)
    plans: list[tuple[Any, list[tuple[_Local, list[str], list[str]]]]] = []
    roots: list[str] = []
    changed: set[str] = set()
    for point, (root, remote) in manifests.items():
        roots.append(root)
        plan = []
        for d in locals_:
            theirs = remote.get(d.dst, {})
            send = [rel for rel, (h, _, _) in d.files.items() if theirs.get(rel) != h]
            delete = [rel for rel in theirs if rel not in d.files]
            plan.append((d, send, delete))
            changed.update(f"{rel}" for rel in send + delete)
        plans.append((point, plan))
    files_sent = bytes_sent = files_deleted = 0
    pending = []
    same = all(_key(p) == _key(plans[0][1]) for _, p in plans)
    targets = (
        [(sync_actors, plans[0][1])]
        if same
        else [(sync_actors.slice(**dict(point)), plan) for point, plan in plans]
    )
    n_hosts = len(plans) if same else 1
    for target, plan in targets:
        for d, send, delete in plan:
            for batch in _batches(d, send, batch_bytes):
                pending.append(target.write.call(d.dst, batch, []))
                files_sent += len(batch) * n_hosts
                bytes_sent += sum(len(b) for _, b, _ in batch) * n_hosts
            if delete:
                pending.append(target.write.call(d.dst, [], delete))
                files_deleted += len(delete) * n_hosts
    for f in pending:
        f.get(timeout=timeout)
    reloaded = _reload(proc_meshes, reloaders, dsts, sorted(changed), timeout)
    skipped = tuple(str(d.src / rel) for d in locals_ for rel in d.skipped)
    return SyncReport(files_sent, bytes_sent, files_deleted, tuple(roots), tuple(reloaded), skipped)


def _key(plan: list[tuple[_Local, list[str], list[str]]]) -> list[tuple[str, list[str], list[str]]]:
    return [(d.dst, send, delete) for d, send, delete in plan]


def _batches(d: _Local, send: list[str], limit: int) -> Iterator[list[tuple[str, bytes, int]]]:
    batch: list[tuple[str, bytes, int]] = []
    size = 0
    for rel in send:
        _, mode, path = d.files[rel]
        data = path.read_bytes()
        if batch and size + len(data) > limit:
            yield batch
            batch, size = [], 0
        batch.append((rel, data, mode))
        size += len(data)
    if batch:
        yield batch


def _reload(
    proc_meshes: Sequence[Any],
    reloaders: dict[int, Any],
    dsts: list[str],
    changed: list[str],
    timeout: float,
) -> list[str]:
    calls = []
    for pm in proc_meshes:
        if pm._state.stopped:
            continue
        entry = reloaders.get(id(pm))
        if entry is None or entry[0] is not pm:
            entry = reloaders[id(pm)] = (pm, pm.spawn("danaus_workspace_reload", WorkspaceReloader))
        actors = entry[1]
        calls.append(actors.reload.call(dsts, changed))
    reloaded: set[str] = set()
    errors: list[str] = []
    for f in calls:
        for results in f.get(timeout=timeout).values():
            for name, error in results:
                if error is None:
                    reloaded.add(name)
                else:
                    errors.append(f"{name} in {error}")
    if errors:
        raise RuntimeError(
            "sync_workspace copied the files, but reloading failed: "
            + "; ".join(errors)
            + ". Fix the module and sync again (or spawn new procs)"
        )
    return sorted(reloaded)


class _Syncs:
    """Per host mesh state: its code-sync procs and actors, reloaders, synced directories."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # guards procs, the code-sync procs of this host mesh
        self.procs: dict[tuple[Any, ...], tuple[Any, Any]] = {}
        self.reloaders: dict[int, Any] = {}
        self.dsts: list[str] = []
        self.hashes: dict[str, tuple[int, int, str]] = {}  # local path -> mtime_ns, size, sha256

    def stop(self) -> list[Any]:
        futures = [pm.stop("the host mesh was stopped") for pm, _ in self.procs.values()]
        self.procs.clear()
        self.reloaders.clear()
        return futures


def run_in_thread(fn: Callable[[], Any]) -> concurrent.futures.Future[Any]:
    """``fn()`` on a thread of its own; its result or exception in the returned future."""
    cf: concurrent.futures.Future[Any] = concurrent.futures.Future()

    def run() -> None:
        try:
            cf.set_result(fn())
        except BaseException as e:
            cf.set_exception(e)

    threading.Thread(target=run, name="danaus-sync-workspace", daemon=True).start()
    return cf
