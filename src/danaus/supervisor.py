"""``danaus.supervisor``: supervisors with Erlang/OTP's restart strategies.

Example:

    from danaus.actor import this_host
    from danaus.supervisor import Supervisor

    procs = this_host().spawn_procs(per_host={"gpus": 4})
    sup = Supervisor(strategy="one_for_one", max_restarts=3, period=60.0)
    workers = sup.spawn(procs, "workers", Worker, "config")  # an ActorMesh
    workers.step.call().get()   # a failed rank is restarted; the handle stays valid

See ``docs/fault-tolerance.md``.
"""

from __future__ import annotations

from ._public import publish
from ._supervision.supervisor import Backoff as Backoff
from ._supervision.supervisor import Restart as Restart
from ._supervision.supervisor import Supervisor as Supervisor

__all__ = ["Backoff", "Restart", "Supervisor"]

publish(globals(), __all__)
