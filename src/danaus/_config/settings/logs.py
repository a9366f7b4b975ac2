"""The settings of logs."""

from __future__ import annotations

from ..setting import Setting, _GiB, _MiB

LOGS: tuple[Setting, ...] = (
    Setting(
        "log_dir",
        "str",
        "",
        "Directory under which each job gets a directory of per-proc log files, on "
        "every host (default: logs/ in the per-user directory of the system's "
        "temporary directory).",
    ),
    Setting(
        "log_retention",
        "duration",
        7 * 86400.0,
        "Job log directories untouched for longer than this are deleted when a new "
        "job starts on the host (0 keeps them all).",
    ),
    Setting(
        "log_file_max",
        "size",
        _GiB,
        "A proc's log file that grows past this is renamed to NAME.log.1 (replacing "
        "an older one) and a new file is started.",
    ),
    Setting(
        "log_pipe_size",
        "size",
        _MiB,
        "Capacity asked of the pipes that carry each proc's stdout and stderr to its "
        "host agent (Linux caps it at /proc/sys/fs/pipe-max-size).",
    ),
    Setting(
        "log_max_line",
        "size",
        64 * 1024,
        "Longer output lines are split into pieces of this size.",
    ),
    Setting(
        "log_forward_window",
        "size",
        4 * _MiB,
        "Bytes of output lines a host agent sends to the client before the client "
        "has printed them.",
    ),
    Setting(
        "log_forward_buffer",
        "size",
        64 * _MiB,
        "Bytes of output lines a host agent holds for a client that does not keep up; "
        "beyond it lines are dropped and the client is told how many.",
    ),
    Setting(
        "log_frame_bytes",
        "size",
        256 * 1024,
        "Most bytes of output lines one forwarded log frame carries.",
    ),
    Setting(
        "log_tail_lines",
        "int",
        30,
        "Last output lines kept per proc: attached to the MeshFailure report of a "
        "crashed proc, and served by the client's log tail.",
    ),
    Setting(
        "log_tail_grace",
        "duration",
        1.0,
        "How long a crashed proc's MeshFailure waits for its last lines of output "
        "(when its connection broke before its host agent reported the exit), and "
        "the default failure report for the output forwarded so far.",
    ),
    Setting(
        "log_flush_timeout",
        "duration",
        10.0,
        "How long ProcMesh.stop() waits for the procs' last output to be printed.",
    ),
    Setting(
        "log_file_level",
        "str",
        "INFO",
        "Level of danaus's own diagnostics written to danaus.log in the job's log directory.",
    ),
    Setting(
        "log_stderr_level",
        "str",
        "ERROR",
        "Level from which the client also prints danaus's own diagnostics to its "
        "stderr (procs and host agents write them to the log file only).",
    ),
    Setting(
        "log_follow_interval",
        "duration",
        0.25,
        "How often `danaus logs --follow` looks for new lines.",
    ),
)
