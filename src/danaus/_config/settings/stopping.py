"""The settings of stopping."""

from __future__ import annotations

from ..setting import Setting

STOPPING: tuple[Setting, ...] = (
    Setting(
        "stop_proc_timeout",
        "duration",
        10.0,
        "How long a stopping proc waits for its actors' cleanup before it exits anyway.",
    ),
    Setting(
        "proc_exit_timeout",
        "duration",
        30.0,
        "How long ProcMesh.stop() waits for a stopped proc's host agent to report that "
        "its process ended, once its connection has closed (exit handlers still run); "
        "a lost agent ends the wait after a second.",
    ),
    Setting(
        "shutdown_timeout",
        "duration",
        10.0,
        "How long shutdown_context() waits for the meshes it stops.",
    ),
    Setting(
        "stopped_actors_remembered",
        "int",
        10_000,
        "How many stopped actors each proc remembers, so that a late call to one is "
        "answered 'was stopped' (older ones are answered 'no such actor'); their "
        "memory is freed either way.",
    ),
    Setting(
        "main_exit_grace",
        "duration",
        5.0,
        "After an unhandled failure, how long the client's main thread gets to "
        "unwind (SystemExit) before danaus exits for it.",
    ),
)
