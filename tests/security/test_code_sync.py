"""``sync_workspace`` under the rules of ``sys.path`` (issue 26, F8).

What a sync writes on a host goes first on its procs' ``sys.path``: the
directories must be the user's (or root's) and writable by no one else, file
modes lose group/other write bits, and the client does not ship what a
symbolic link out of the workspace points to (``~/.ssh``) unless asked.

Ownership is checked with real uids: the test (root) gives directories to uid
1002 and runs the host side in a child that has become uid 1001.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from danaus import _config as config
from danaus._actor.api.code_sync import CodeSyncActor, Workspace, _files, add_to_sys_path
from danaus.testing import ClientScript

pytestmark = pytest.mark.timeout(90)

USER, OTHER = 1001, 1002


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory in /tmp that both test uids can reach (the test's tmp_path is 0700)."""
    d = Path(tempfile.mkdtemp(prefix="danaus-codesync-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _mkdir(path: Path, uid: int, mode: int) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, uid, uid)
    path.chmod(mode)
    return path


def as_user(uid: int, root: Path, fn: Callable[[], Any]) -> tuple[str, str]:
    """``fn()`` in a forked child that became ``uid`` (real, effective and saved; no
    groups) with ``root`` as its workspace root: ``("ok", repr(result))`` or
    ``(exception type, message)``."""
    if os.geteuid() != 0:
        pytest.fail("these tests act as two users: run them as root (as CI does)")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        code = 1
        try:
            os.close(r)
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            with config.configured(workspace_dir=str(root)):
                try:
                    result = ["ok", repr(fn())]
                except BaseException as e:
                    result = [type(e).__name__, str(e)]
            os.write(w, json.dumps(result).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and data, f"the child as uid {uid} failed"
    kind, text = json.loads(data)
    return kind, text


def _sync_one(dst: str = "proj") -> tuple[int, int]:
    """The host side of one sync of one file (what CodeSyncActor does for the client)."""
    actor = CodeSyncActor()
    actor.manifest([dst])
    return actor.write(dst, [("pkg/mod.py", b"value = 1\n", 0o644)], [])


# -- the destination: owner and mode ---------------------------------------------------


def test_a_workspace_root_owned_by_another_user_is_refused_with_the_fix(shared: Path) -> None:
    # uid 1002 made the root (and a module in it); uid 1001 would sync into it and import
    # from it. Before the fix: the manifest read it and add_to_sys_path put it first.
    root = _mkdir(shared / "ws", OTHER, 0o755)
    proj = _mkdir(root / "proj", OTHER, 0o755)
    (proj / "evil.py").write_text("raise SystemExit('planted')\n")
    kind, text = as_user(USER, root, _sync_one)
    assert kind == "PermissionError", text
    assert f"belongs to uid {OTHER}" in text and str(root) in text
    assert "chmod go-w" in text and "workspace_dir" in text
    kind, text = as_user(USER, root, lambda: add_to_sys_path(["proj"]) and sys.path[0])
    assert kind == "PermissionError" and f"belongs to uid {OTHER}" in text, text


def test_a_destination_directory_owned_by_another_user_is_refused(shared: Path) -> None:
    root = _mkdir(shared / "ws", USER, 0o755)
    _mkdir(root / "proj", OTHER, 0o755)
    kind, text = as_user(USER, root, _sync_one)
    assert kind == "PermissionError", text
    assert str(root / "proj") in text and f"belongs to uid {OTHER}" in text
    kind, text = as_user(USER, root, lambda: add_to_sys_path(["proj"]))
    assert kind == "PermissionError" and str(root / "proj") in text, text


def test_a_destination_others_may_write_to_is_refused(shared: Path) -> None:
    # Owned by the user, but 0777 (or 0775 under umask 002): anyone could add a module.
    root = _mkdir(shared / "ws", USER, 0o777)
    kind, text = as_user(USER, root, _sync_one)
    assert kind == "PermissionError" and "group or others may write to it" in text, text
    root.chmod(0o755)
    _mkdir(root / "proj", USER, 0o775)
    kind, text = as_user(USER, root, _sync_one)
    assert kind == "PermissionError" and "(mode 0o775)" in text, text
    kind, text = as_user(USER, root, lambda: add_to_sys_path(["proj"]))
    assert kind == "PermissionError" and "(mode 0o775)" in text, text
    # A package directory below it, the same.
    (root / "proj").chmod(0o755)
    _mkdir(root / "proj" / "pkg", USER, 0o777)
    kind, text = as_user(USER, root, _sync_one)
    assert kind == "PermissionError" and str(root / "proj" / "pkg") in text, text


def test_a_root_owned_root_and_the_users_own_destination_are_accepted(shared: Path) -> None:
    root = _mkdir(shared / "ws", 0, 0o755)  # e.g. a directory an administrator made
    _mkdir(root / "proj", USER, 0o755)
    kind, text = as_user(USER, root, _sync_one)
    assert (kind, text) == ("ok", "(1, 0)")
    kind, text = as_user(USER, root, lambda: add_to_sys_path(["proj"]) == [sys.path[0]])
    assert (kind, text) == ("ok", "True")
    # What it created is the user's, 0755 whatever the umask, and the file 0644.
    assert (root / "proj" / "pkg").stat().st_uid == USER
    assert stat.S_IMODE((root / "proj" / "pkg").stat().st_mode) == 0o755
    assert stat.S_IMODE((root / "proj" / "pkg" / "mod.py").stat().st_mode) == 0o644


def test_directories_a_sync_creates_are_0755_even_under_a_permissive_umask(
    shared: Path,
) -> None:
    root = shared / "fresh" / "ws"  # nothing exists yet

    def sync_with_umask() -> tuple[int, int]:
        os.umask(0o000)
        return _sync_one()

    _mkdir(shared / "fresh", USER, 0o755)
    assert as_user(USER, root, sync_with_umask) == ("ok", "(1, 0)")
    for d in (root, root / "proj", root / "proj" / "pkg"):
        assert stat.S_IMODE(d.stat().st_mode) == 0o755, d


def test_a_link_in_the_destination_cannot_lead_a_write_or_delete_out_of_it(
    shared: Path,
) -> None:
    root = _mkdir(shared / "ws", USER, 0o755)
    proj = _mkdir(root / "proj", USER, 0o755)
    elsewhere = _mkdir(shared / "elsewhere", USER, 0o755)
    (elsewhere / "keep.py").write_text("kept = True\n")
    (proj / "pkg").symlink_to(elsewhere)
    kind, text = as_user(USER, root, _sync_one)
    assert kind == "PermissionError" and "leads out of the workspace directory" in text, text
    kind, text = as_user(USER, root, lambda: CodeSyncActor().write("proj", [], ["pkg/keep.py"]))
    assert kind == "PermissionError", text
    assert (elsewhere / "keep.py").exists() and not (elsewhere / "mod.py").exists()


# -- file modes ------------------------------------------------------------------------


def test_modes_lose_group_and_other_write_and_set_id_bits_on_the_host(shared: Path) -> None:
    root = _mkdir(shared / "ws", USER, 0o755)
    files = [("a.py", b"", 0o666), ("run.sh", b"", 0o777), ("s", b"", 0o4775), ("p", b"", 0o600)]
    kind, text = as_user(USER, root, lambda: CodeSyncActor().write("proj", files, []))
    assert (kind, text) == ("ok", "(4, 0)")
    modes = {
        n: stat.S_IMODE((root / "proj" / n).stat().st_mode) for n in ("a.py", "run.sh", "s", "p")
    }
    assert modes == {"a.py": 0o644, "run.sh": 0o755, "s": 0o755, "p": 0o600}


# -- end to end: a client syncing to its own host ----------------------------------------


SYNC = """
    import json, sys
    from danaus.actor import Actor, endpoint, this_host
    from danaus.tools.config import Workspace

    class Path_(Actor):
        @endpoint
        def first(self):
            return sys.path[0]

    follow = FOLLOW
    host = this_host()
    report = host.sync_workspace(Workspace(dirs=["proj"], follow_symlinks=follow)).get(timeout=60)
    procs = host.spawn_procs(per_host={"gpus": 1})
    first = procs.spawn("p", Path_).first.call_one().get(timeout=60)
    print(json.dumps({"skipped": list(report.skipped_links), "first": first}), flush=True)
    procs.stop().get(timeout=30)
"""


@pytest.fixture
def client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[Path], Any]]:
    """``client(root)``: a ``ClientScript`` whose host's workspace root is ``root``."""
    made: list[ClientScript] = []

    def make(root: Path) -> ClientScript:
        monkeypatch.setenv("DANAUS_WORKSPACE_DIR", str(root))  # inherited by the client
        made.append(ClientScript(tmp_path))
        return made[-1]

    yield make
    for cs in made:
        cs.close()


def _workspace_with_links(tmp_path: Path) -> tuple[Path, Path]:
    """``proj`` with links: out of it (a "~/.ssh" dir, a key file), inside it, back up."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("PRIVATE KEY\n")
    proj = tmp_path / "proj"
    (proj / "pkg").mkdir(parents=True)
    (proj / "pkg" / "mod.py").write_text("value = 1\n")
    (proj / "pkg" / "rw.py").write_text("")
    (proj / "pkg" / "rw.py").chmod(0o666)
    (proj / "ssh").symlink_to(home / ".ssh")
    (proj / "key").symlink_to(home / ".ssh" / "id_ed25519")
    (proj / "alias").symlink_to(proj / "pkg")  # inside: followed
    (proj / "pkg" / "up").symlink_to("..")  # back up: not walked again
    return proj, home


def test_links_out_of_the_workspace_are_not_followed_unless_asked(
    tmp_path: Path, client: Callable[[Path], ClientScript]
) -> None:
    _workspace_with_links(tmp_path)
    root = tmp_path / "root"
    cs = client(root)
    out = cs.run(SYNC.replace("FOLLOW", "False"))
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert sorted(got["skipped"]) == ["proj/key", "proj/ssh"]  # as the workspace names them
    synced = sorted(str(p.relative_to(root / "proj")) for p in (root / "proj").rglob("*"))
    assert synced == ["alias", "alias/mod.py", "alias/rw.py", "pkg", "pkg/mod.py", "pkg/rw.py"]
    assert got["first"] == str(root / "proj")  # the synced directory leads sys.path
    assert stat.S_IMODE((root / "proj" / "pkg" / "rw.py").stat().st_mode) == 0o644
    assert stat.S_IMODE((root / "proj" / "pkg").stat().st_mode) == 0o755

    # Asked for: what the links point to is sent, under the links' names.
    out = cs.run(SYNC.replace("FOLLOW", "True"))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1])["skipped"] == []
    assert (root / "proj" / "ssh" / "id_ed25519").read_text() == "PRIVATE KEY\n"
    assert (root / "proj" / "key").read_text() == "PRIVATE KEY\n"


def test_a_world_writable_workspace_root_fails_the_sync_and_says_why(
    tmp_path: Path, client: Callable[[Path], ClientScript]
) -> None:
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "mod.py").write_text("value = 1\n")
    root = tmp_path / "root"
    root.mkdir()
    root.chmod(0o777)
    out = client(root).run(SYNC.replace("FOLLOW", "False"))
    assert out.returncode != 0
    assert "PermissionError" in out.stderr and "group or others may write to it" in out.stderr
    assert str(root) in out.stderr
    assert not (root / "proj").exists() or not any((root / "proj").iterdir())


def test_the_client_side_walk_and_merge_follow_the_same_rules(tmp_path: Path) -> None:
    proj, _ = _workspace_with_links(tmp_path)
    skipped: list[str] = []
    assert sorted(rel for rel, _, _ in _files(proj, False, skipped)) == [
        "alias/mod.py", "alias/rw.py", "pkg/mod.py", "pkg/rw.py",
    ]  # fmt: skip
    assert sorted(skipped) == ["key", "ssh"]
    out = tmp_path / "merged"
    Workspace(dirs=[proj]).merge(out)
    assert not (out / "proj" / "ssh").exists() and not (out / "proj" / "key").exists()
    assert stat.S_IMODE((out / "proj" / "pkg" / "rw.py").stat().st_mode) == 0o644
    Workspace(dirs=[proj], follow_symlinks=True).merge(out)
    assert (out / "proj" / "ssh" / "id_ed25519").exists()
    with pytest.raises(TypeError, match="follow_symlinks must be True or False"):
        Workspace(dirs=[proj], follow_symlinks="yes")  # type: ignore[arg-type]
