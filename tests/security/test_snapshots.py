"""An array passed to a call is what the receiver gets, whatever the caller does next.

Monarch pickles at call time; danaus sends arrays without pickling their
bytes, so it must copy whatever it does not write at once: frames queued for a
proc still starting, frames behind a full socket, and large buffers the
receiver reads straight out of the caller's memory (offload). Each case is
made deterministic: the proc is still starting, or stopped (SIGSTOP) while
the caller changes the array.
"""

from __future__ import annotations

import pytest

from danaus.testing import ClientScript

pytestmark = pytest.mark.timeout(90)

SCRIPT = """
import hashlib, os, signal, sys
import numpy as np
import danaus.actor
from danaus.actor import Actor, endpoint, this_host
from danaus.testing import freeze

faults = []
danaus.actor.unhandled_fault_hook = faults.append

class Digest(Actor):
    @endpoint
    def pid(self):
        return os.getpid()

    @endpoint
    def digest(self, a):
        return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()

def digest(a):
    return hashlib.sha256(a.tobytes()).hexdigest()

case = sys.argv[1]
n = int(sys.argv[2])
pm = this_host().spawn_procs(per_host={"gpus": 1})
actor = pm.spawn("digest", Digest)
a = np.arange(n, dtype=np.uint8)
want = digest(a)
if case == "starting":
    fut = actor.digest.call_one(a)  # the proc is not up yet: the frame waits
    a[:] = 7
else:
    actor.digest.call_one(a).get(timeout=30)  # connected (offload agreed for big ones)
    pid = actor.pid.call_one().get(timeout=30)
    freeze(pid)  # nothing is read until it resumes
    try:
        fut = actor.digest.call_one(a)
        a[:] = 7
    finally:
        os.kill(pid, signal.SIGCONT)
print("same" if fut.get(timeout=30) == want else "changed")
pm.stop().get(timeout=30)
"""


@pytest.mark.parametrize(
    "case, n",
    [("starting", 1 << 16), ("stopped", 4 << 20), ("stopped", 900 << 10)],
    ids=["queued-for-a-starting-proc", "offloaded", "behind-the-socket"],
)
def test_changing_an_array_after_call_does_not_change_what_the_actor_gets(
    tmp_path, case: str, n: int
) -> None:
    script = ClientScript(tmp_path)
    path = script.write(SCRIPT)
    import subprocess
    import sys

    from danaus.testing import client_env

    out = subprocess.run(
        [sys.executable, str(path), case, str(n)],
        env=client_env(), capture_output=True, text=True, timeout=80,
    )  # fmt: skip
    assert out.stdout.strip().endswith("same"), (out.stdout, out.stderr[-3000:])
