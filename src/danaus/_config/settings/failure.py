"""The settings of failure detection."""

from __future__ import annotations

from ..setting import Setting

FAILURE: tuple[Setting, ...] = (
    Setting(
        "heartbeat_interval",
        "duration",
        0.5,
        "A quiet TCP connection sends a ping after this long.",
    ),
    Setting(
        "heartbeat_timeout",
        "duration",
        5.0,
        "A peer silent this long is judged: one on this host is lost if its kernel "
        "says it is stopped or gone, or it neither answers nor runs for half this "
        "again (a proc that runs is slow, not lost); one on another host is lost "
        "now if its frames came steadily, later (up to 2x) if they came irregularly "
        "(a phi-accrual detector).",
    ),
    Setting(
        "restart_retry_initial",
        "duration",
        0.5,
        "A supervisor that finds no host for a rank it restarts (its host gone, no spare "
        "host taking it) tries again after this long, doubling each time, at most "
        "restart_retry_cap; each try counts toward its restart intensity. Meanwhile calls "
        "to the rank fail with SupervisionError.",
    ),
    Setting(
        "restart_retry_cap",
        "duration",
        30.0,
        "The longest wait between a supervisor's tries to place a rank no host took "
        "(see restart_retry_initial).",
    ),
    Setting(
        "exit_report_grace",
        "duration",
        0.05,
        "After a spawned proc's connection closes, how long to wait for the host "
        "agent's report of how it exited before declaring it lost anyway.",
    ),
    Setting(
        "tcp_keepalive_idle",
        "duration",
        60.0,
        "Idle time after which the kernel sends its first TCP keepalive probe on the TCP "
        "message connections a process opens (whole seconds, at least 1): it lets a "
        "firewall or NAT keep an idle connection open, and the kernel see a peer host gone; "
        "a silent peer is judged sooner by heartbeat_timeout.",
    ),
)
