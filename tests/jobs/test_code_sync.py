"""``HostMesh.sync_workspace``: the client's code on hosts that share no directory with it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from danaus._actor.api.code_sync import _module_name
from danaus.tools.config import Workspace

from .conftest import Scripts

SYNC_CLIENT = """
    import json, os, sys
    from pathlib import Path
    from danaus.actor import Actor, attach_to_workers, endpoint
    from danaus.tools.config import Workspace

    class Probe(Actor):
        @endpoint
        def probe(self, name):
            import importlib
            mod = importlib.import_module(name)
            return mod.value(), mod.__file__, os.stat("/proc/self/ns/net").st_ino

    def show(report):
        return {"sent": report.files_sent, "deleted": report.files_deleted,
                "roots": list(report.roots), "reloaded": list(report.reloaded)}

    out = {}
    proj = Path("proj")
    hosts = attach_to_workers(workers=sys.argv[1].split(","), secret=sys.argv[2])
    ws = Workspace(dirs=[proj])
    out["first"] = show(hosts.sync_workspace(ws).get(timeout=60))
    procs = hosts.spawn_procs(per_host={"gpus": 2})
    probe = procs.spawn("probe", Probe)
    out["before"] = list(probe.probe.call("pkg.mod").get(timeout=30).values())

    # The user edits locally: one module changed, one file added, one removed.
    (proj / "pkg" / "mod.py").write_text("def value():\\n    return 'edited'\\n")
    (proj / "pkg" / "extra.py").write_text("def value():\\n    return 'extra'\\n")
    (proj / "notes.txt").unlink()
    out["second"] = show(hosts.sync_workspace(ws).get(timeout=60))
    out["after"] = list(probe.probe.call("pkg.mod").get(timeout=30).values())
    out["unchanged"] = show(hosts.sync_workspace(ws).get(timeout=60))

    # Procs spawned after a sync find the workspace on sys.path from the start.
    later = hosts.spawn_procs(per_host={"gpus": 1}).spawn("later", Probe)
    out["later"] = list(later.probe.call("pkg.extra").get(timeout=30).values())

    # A broken edit: the files still land, the reload error names module and proc.
    (proj / "pkg" / "mod.py").write_text("def value(:\\n")
    try:
        hosts.sync_workspace(ws).get(timeout=60)
        out["broken"] = None
    except RuntimeError as e:
        out["broken"] = str(e)
    print(json.dumps(out), flush=True)
    hosts.stop().get(timeout=30)  # the workers stay for the next test's client
"""


@pytest.mark.timeout(120)
def test_sync_workspace_reaches_hosts_that_share_no_directory(
    private_hosts: dict, scripts: Scripts
) -> None:
    root = private_hosts["root"]
    proj = scripts.tmp_path / "proj"
    (proj / "pkg").mkdir(parents=True)
    (proj / "pkg" / "__init__.py").write_text("")
    (proj / "pkg" / "mod.py").write_text("def value():\n    return 'original'\n")
    (proj / "notes.txt").write_text("to be deleted\n")
    path = scripts.write(SYNC_CLIENT)
    client = scripts.start_path(path, ",".join(private_hosts["workers"]), private_hosts["secret"])
    stdout, stderr = client.communicate(timeout=100)
    assert client.returncode == 0, stderr
    out = json.loads(stdout.strip().splitlines()[-1])

    # 3 files to each of 2 hosts, each under its own root (same path, private file system).
    assert out["first"] == {"sent": 6, "deleted": 0, "roots": [root, root], "reloaded": []}
    values, files, netns = zip(*out["before"], strict=True)
    assert set(values) == {"original"}
    assert set(files) == {os.path.join(root, "proj", "pkg", "mod.py")}
    assert len(set(netns)) == 2  # two hosts, two procs each
    assert os.listdir(root) == []  # the client's namespace sees none of it
    assert not (proj / "pkg" / "__pycache__").exists()  # nothing imported from the client's dir

    # Only the changed and the new file travel; the removed one is deleted; mod reloaded.
    assert out["second"] == {
        "sent": 4,
        "deleted": 2,
        "roots": [root, root],
        "reloaded": ["pkg.mod"],
    }
    assert {v for v, _, _ in out["after"]} == {"edited"}
    assert out["unchanged"] == {"sent": 0, "deleted": 0, "roots": [root, root], "reloaded": []}
    assert {v for v, _, _ in out["later"]} == {"extra"}
    assert {f for _, f, _ in out["later"]} == {os.path.join(root, "proj", "pkg", "extra.py")}
    assert out["broken"] is not None
    assert "reloading failed: pkg.mod in proc hosts=" in out["broken"]
    assert "SyntaxError" in out["broken"]


def test_workspace_names_and_checks_its_directories(tmp_path: Path) -> None:
    (tmp_path / "trainer").mkdir()
    ws = Workspace(dirs=[tmp_path / "trainer"])
    assert ws.dirs == {tmp_path / "trainer": "trainer"}
    assert Workspace(dirs={str(tmp_path / "trainer"): "code/t"}).dirs == {
        tmp_path / "trainer": "code/t"
    }
    assert Workspace.null().dirs == {}
    with pytest.raises(ValueError, match="stays inside it"):
        Workspace(dirs={tmp_path: "../elsewhere"})
    with pytest.raises(ValueError, match="stays inside it"):
        Workspace(dirs={tmp_path: "/abs"})
    with pytest.raises(TypeError, match="list of directories"):
        Workspace(dirs=str(tmp_path))  # type: ignore[arg-type]
    out = tmp_path / "merged"
    (tmp_path / "trainer" / "a.py").write_text("x = 1\n")
    ws.merge(out)
    assert (out / "trainer" / "a.py").read_text() == "x = 1\n"


def test_bad_workspaces_are_refused_before_anything_is_sent(tmp_path: Path) -> None:
    from danaus.actor import this_host

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    host = this_host()
    with pytest.raises(ValueError, match="does not exist"):
        host.sync_workspace(Workspace(dirs=[tmp_path / "missing"]))
    with pytest.raises(ValueError, match="overlap"):
        host.sync_workspace(Workspace(dirs={tmp_path / "a": "x", tmp_path / "b": "x/y"}))
    with pytest.raises(NotImplementedError, match="conda"):
        host.sync_workspace(Workspace(dirs=[tmp_path / "a"]), conda=True)
    with pytest.raises(TypeError, match="needs a Workspace"):
        host.sync_workspace([tmp_path / "a"])  # type: ignore[arg-type]


def test_module_names_of_synced_files() -> None:
    assert _module_name("pkg/mod.py") == "pkg.mod"
    assert _module_name("pkg/__init__.py") == "pkg"
    assert _module_name("top.py") == "top"
    assert _module_name("README.md") is None
    assert _module_name("my-scripts/run.py") is None
