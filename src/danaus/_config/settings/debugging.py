"""The settings of debugging."""

from __future__ import annotations

from ..setting import Setting, _MiB

DEBUGGING: tuple[Setting, ...] = (
    Setting(
        "debug_terminal",
        "bool",
        True,
        "When the client runs in an interactive terminal, offer the debugger prompt "
        "there as soon as an actor pauses in breakpoint() (`danaus debug` takes it over).",
    ),
    Setting(
        "debug_post_mortem",
        "bool",
        True,
        "An endpoint that raises after its breakpoint() opened a debug session stops "
        "in post-mortem pdb before its caller hears the error.",
    ),
    Setting(
        "debug_cast_wait",
        "duration",
        5.0,
        "How long the debugger's cast waits for the sessions to finish the command "
        "before it returns to the prompt (their output shows on attach).",
    ),
    Setting(
        "debug_output_max",
        "size",
        _MiB,
        "How much of a debug session's output (characters) is kept, in the paused "
        "proc until it is sent and in the client until it is shown: the last this "
        "much, after a line saying how much was dropped.",
    ),
)
