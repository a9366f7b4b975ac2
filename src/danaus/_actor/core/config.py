"""Actor-layer settings a program changes by assignment: Monarch's ``monarch.actor.config``.

``danaus.actor.config`` is this module, so setting
``danaus.actor.config.prefix_python_logs_with_actor = False`` changes what
`danaus._actor.core.logprefix` reads on the next log record. Settings that
come from the environment or ``configure()`` are in ``danaus.config``.
"""

from __future__ import annotations

# Read on every log record made while this process has an actor context: whether its
# message starts with ``[actor=<the running actor>] `` (Monarch's default, True).
prefix_python_logs_with_actor = True
