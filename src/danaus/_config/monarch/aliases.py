"""Monarch's option names that are aliases of a danaus setting: both names read and
write one value, converted where the units differ."""

from __future__ import annotations

from ..setting import _GiB
from .option import _H, _HM, _MR, MonarchOption, _m

ALIASES: tuple[MonarchOption, ...] = (
    _m(
        "codec_max_frame_length",
        "int",
        10 * _GiB,
        _H + "CODEC_MAX_FRAME_LENGTH",
        "the same setting (also takes a size string such as '1GiB').",
        setting="codec_max_frame_length",
        unit="bytes",
    ),
    _m(
        "stop_actor_timeout",
        "duration",
        "10s",
        _H + "STOP_ACTOR_TIMEOUT",
        "Monarch's duration string; danaus's value is seconds ('5s' is 5.0).",
        setting="stop_proc_timeout",
    ),
    _m(
        "tail_log_lines",
        "int",
        0,
        _HM + "TAIL_LOG_LINES",
        "the same count.",
        setting="log_tail_lines",
        unit="lines",
    ),
    _m(
        "max_cast_fanout",
        "nonzero",
        16,
        _HM + "MAX_CAST_FANOUT",
        "the same count.",
        setting="tree_fanout",
    ),
    _m(
        "rdma_tcp_fallback_parallelism",
        "int",
        1,
        _MR + "TCP_FALLBACK_PARALLELISM",
        "the same count.",
        setting="rdma_streams",
        unit="connections",
    ),
    _m(
        "terminated_snapshot_retention",
        "int",
        100,
        _H + "TERMINATED_SNAPSHOT_RETENTION",
        "the same count (danaus's default is 10000).",
        setting="stopped_actors_remembered",
        unit="actors",
    ),
    _m(
        "file_log_level",
        "level",
        "",
        "MONARCH_FILE_LOG",
        "Monarch's lower-case names ('debug', 'info', 'warn', 'error'; '' is 'info'); "
        "danaus's value is the logging name ('DEBUG', 'INFO', 'WARNING', 'ERROR').",
        setting="log_file_level",
    ),
    _m(
        "forwarder_flush_timeout",
        "duration",
        "5s",
        _H + "FORWARDER_FLUSH_TIMEOUT",
        "how long teardown waits for unsent messages to be written; Monarch's duration "
        "string, danaus's value is seconds.",
        setting="flush_timeout",
    ),
    _m(
        "mesh_admin_pyspy_timeout",
        "duration",
        "10s",
        _HM + "ADMIN_PYSPY_TIMEOUT",
        "how long one py-spy dump of a proc may run; Monarch's duration string, danaus's "
        "value is seconds (danaus's default is 20s).",
        setting="stack_timeout",
    ),
    _m(
        "pyspy_bin",
        "str",
        "",
        "PYSPY_BIN",
        "the same path, tried before the usual lookup (set it through configure() or "
        "DANAUS_PYSPY_BIN; Monarch's variable PYSPY_BIN is not read).",
        setting="pyspy_bin",
    ),
    _m(
        "channel_tcp_keepalive_idle",
        "duration",
        "1m",
        _H + "CHANNEL_TCP_KEEPALIVE_IDLE",
        "the kernel's keepalive idle time (TCP_KEEPIDLE) on TCP message connections; "
        "Monarch's duration string, danaus's value is seconds.",
        setting="tcp_keepalive_idle",
    ),
)
