"""A forked proc starts from what its zygote already holds, at little CPU of its own.

Spawn time is mostly CPU spent in each new proc, times the number of procs.
Two things made it grow: a danaus module a proc imports after its fork (the
zygote stopped preloading danaus.actor, and every proc imported it again,
~60 ms each), and the collector walking the inherited objects in every proc
(its collections and its final one at exit write each object's header,
copying every page the zygote shared with it).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from danaus.testing import client_env

# Which danaus modules a zygote holds: what the agent imports, then its preloads.
_ZYGOTE_MODULES = """
import importlib, json, sys
import danaus._runtime.hosting.agent
from danaus._runtime.node import preload_modules
for name in preload_modules():
    importlib.import_module(name)
print(json.dumps(sorted(m for m in sys.modules if m.startswith("danaus"))))
"""

# A plain user script: its actor class travels by value, as any __main__ class does.
_CLIENT = """
import json
from danaus.actor import Actor, endpoint, this_host

class Probe(Actor):
    @endpoint
    def look(self):
        import gc, sys
        danaus = sorted(m for m in sys.modules if m.startswith("danaus"))
        return danaus, gc.get_freeze_count()

procs = this_host().spawn_procs(per_host={"gpus": 1})
modules, frozen = procs.spawn("probe", Probe).look.call_one().get(timeout=60)
procs.stop().get(timeout=60)
print("PROBE " + json.dumps({"modules": modules, "frozen": frozen}))
"""


def _probe(client_script) -> dict:
    result = client_script.run(_CLIENT, timeout=120)
    assert result.returncode == 0, result.stderr
    line = next(x for x in result.stdout.splitlines() if x.startswith("PROBE "))
    out: dict = json.loads(line[len("PROBE ") :])
    return out


@pytest.mark.timeout(180)
def test_a_proc_imports_no_danaus_module_after_its_fork(client_script) -> None:
    zygote = subprocess.run(
        [sys.executable, "-c", _ZYGOTE_MODULES],
        env=client_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    preloaded = set(json.loads(zygote.stdout))
    late = sorted(set(_probe(client_script)["modules"]) - preloaded)
    assert late == [], f"imported by each proc after its fork (preload them): {late}"


@pytest.mark.timeout(180)
def test_a_proc_inherits_the_zygote_s_objects_frozen(client_script) -> None:
    # Frozen objects are never walked by the proc's collector, so their pages stay shared.
    assert _probe(client_script)["frozen"] > 10_000


_CLIENT_PRELOADED = """
from danaus.actor import Actor, endpoint, this_host

class Probe(Actor):
    @endpoint
    def loaded(self):
        import sys
        return [m for m in ("colorsys", "this_module_does_not_exist") if m in sys.modules]

procs = this_host().spawn_procs(per_host={"gpus": 1})
print("PROBE", procs.spawn("probe", Probe).loaded.call_one().get(timeout=60))
procs.stop().get(timeout=60)
"""


@pytest.mark.timeout(180)
def test_zygote_preload_gives_every_proc_the_modules_it_names(
    client_script, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``zygote_preload`` (here through its environment variable): the zygote imports
    the modules once and each proc starts with them (issue 44: a replacement replica
    forks with torch loaded instead of importing it); one that cannot be imported is
    reported and skipped, not fatal."""
    monkeypatch.setenv("DANAUS_ZYGOTE_PRELOAD", "colorsys, this_module_does_not_exist")
    result = client_script.run(_CLIENT_PRELOADED, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "PROBE ['colorsys']" in result.stdout, result.stdout
    assert "No module named 'this_module_does_not_exist'" in result.stderr
