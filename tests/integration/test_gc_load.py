"""What danaus leaves to the cyclic garbage collector.

A client that imported torch holds ~170,000 objects the collector tracks, and
a pipelined batch of calls promotes enough per-call objects to trigger full
collections, which visit every one of them. So the client's runtime freezes
what is alive when it starts (``gc_freeze``), and a call keeps few tracked
objects alive. These tests count objects; they never time anything. That a reply's
``Deferred`` value is computed once: ``tests/unit/actor/test_deferred.py``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest


def test_the_client_freezes_what_lives_when_its_runtime_starts(client_script: Any) -> None:
    result = client_script.run(
        """
        import gc, json
        before = [object() for _ in range(3)]
        early = {"a": [1, 2]}  # tracked by the collector
        from danaus.actor import this_proc
        assert gc.get_freeze_count() == 0
        this_proc()  # starts the client's runtime
        frozen = gc.get_freeze_count()
        late = {"b": [3]}
        tracked = {id(o) for o in gc.get_objects()}
        print(json.dumps({"frozen": frozen, "early_tracked": id(early) in tracked,
                          "late_tracked": id(late) in tracked}))
        """
    )
    assert result.returncode == 0, result.stderr
    got = json.loads(result.stdout.strip().splitlines()[-1])
    assert got["frozen"] > 1000  # the modules imported so far
    assert got["early_tracked"] is False and got["late_tracked"] is True


@pytest.mark.parametrize(
    "setup",
    ["import danaus.config; danaus.config.configure(gc_freeze=False)", "import gc; gc.disable()"],
)
def test_no_freeze_when_turned_off_or_the_program_manages_the_collector(
    client_script: Any, setup: str
) -> None:
    result = client_script.run(
        f"""
        import gc
        {setup}
        from danaus.actor import this_proc
        this_proc()
        print(gc.get_freeze_count())
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "0"


def test_a_pipelined_batch_keeps_few_tracked_objects_per_future(client_script: Any) -> None:
    result = client_script.run(
        """
        import gc
        from danaus.actor import Actor, endpoint, this_host

        class Echo(Actor):
            @endpoint
            def echo(self, x):
                return x

        procs = this_host().spawn_procs(per_host={"gpus": 1})
        one = procs.spawn("echo", Echo)
        one.echo.call_one(0).get(timeout=60)
        n = 2000
        gc.collect()
        gc.disable()
        base = len(gc.get_objects())
        futs = [one.echo.call_one(i) for i in range(n)]
        assert [f.get(timeout=60) for f in futs] == list(range(n))
        print((len(gc.get_objects()) - base) / n)
        gc.enable()
        procs.stop().get(timeout=60)
        """,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    # The future and its result slot; a reply still undecoded when get() began adds one.
    assert float(result.stdout.strip().splitlines()[-1]) <= 3.0


def test_a_spawned_proc_freezes_what_it_booted_with(client_script: Any) -> None:
    result = client_script.run(
        """
        import gc
        from danaus.actor import Actor, endpoint, this_host

        class Probe(Actor):
            @endpoint
            def frozen(self):
                return gc.get_freeze_count()

        procs = this_host().spawn_procs(per_host={"gpus": 1})
        print(procs.spawn("probe", Probe).frozen.call_one().get(timeout=60))
        procs.stop().get(timeout=60)
        """,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert int(result.stdout.strip().splitlines()[-1]) > 1000
