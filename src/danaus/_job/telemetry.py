"""``TelemetryConfig`` and what ``JobTrait.enable_telemetry(...)`` starts at ``state()``.

As Monarch's: ``job.enable_telemetry(TelemetryConfig(...))`` (or its fields as
keywords) returns the job, and telemetry starts when ``job.state()`` is next
called. Starting is best effort, as Monarch's: a failure (OpenTelemetry not
installed, an unknown exporter named in ``OTEL_*``) is logged and the job runs
without telemetry rather than ``state()`` failing (a ``RuntimeWarning`` says why).

What starts (see ``danaus._actor.core.telemetry``): OpenTelemetry in the client
and in every proc spawned from then on (calls made inside a span carry its
context, their endpoints run in child spans, each process exports over OTLP as
the ``OTEL_*`` variables say), and, with ``include_dashboard``, danaus's web
dashboard on ``dashboard_port`` at once (its address is printed, as Monarch prints
its dashboard's). The job's state then carries, as Monarch's does,
``query_engine_client`` (``query(sql)`` over the telemetry tables, answering
``{"columns", "rows"}``) and, with ``include_dashboard``, ``dashboard_url`` (the
running dashboard's address, with its token). The tables are kept in an embedded
DuckDB file in the client's job directory (``_observe/history.py``): a snapshot
every ``snapshot_interval_secs``, rows older than ``retention_secs`` swept, as
Monarch documents; ``danaus query --job JOB`` reads a finished job's.
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from dataclasses import dataclass
from typing import Any

from .. import _config as config
from .._actor.api.extensions import Extensions
from .._actor.core import telemetry
from .._runtime.node import Node, this_node

__all__ = ["MeshAdminConfig", "TelemetryConfig", "active_config", "fill_state", "start"]

log = logging.getLogger("danaus.telemetry")


@dataclass
class TelemetryConfig:
    """Configuration of a job's telemetry, started by ``state()`` after
    ``JobTrait.enable_telemetry`` (Monarch's fields and defaults).

    Args:
        retention_secs: how long the kept history holds messages, spans and
            metrics, in seconds (0: no limit).
        include_dashboard: start danaus's web dashboard (its address is printed).
        dashboard_port: the dashboard's port (0: any free port).
        snapshot_interval_secs: how often every proc's telemetry (actors,
            metrics, new messages and spans) is written to the history, in seconds
            (0: only when a query runs).
    """

    retention_secs: int = 3600
    include_dashboard: bool = False
    dashboard_port: int = 8265
    snapshot_interval_secs: float = 30.0

    def __post_init__(self) -> None:
        for f, kinds in (
            ("retention_secs", (int,)),
            ("include_dashboard", (bool,)),
            ("dashboard_port", (int,)),
            ("snapshot_interval_secs", (int, float)),
        ):
            value = getattr(self, f)
            if not isinstance(value, kinds) or (bool not in kinds and isinstance(value, bool)):
                raise TypeError(
                    f"TelemetryConfig.{f} must be {' or '.join(k.__name__ for k in kinds)}, "
                    f"got {value!r}"
                )
        if self.retention_secs < 0:
            raise ValueError(
                f"TelemetryConfig.retention_secs must be >= 0, got {self.retention_secs}"
            )
        if not 0 <= self.dashboard_port <= 65535:
            raise ValueError(
                f"TelemetryConfig.dashboard_port must be 0..65535, got {self.dashboard_port}"
            )
        if self.snapshot_interval_secs < 0:
            raise ValueError(
                "TelemetryConfig.snapshot_interval_secs must be >= 0, got "
                f"{self.snapshot_interval_secs}"
            )


def fill_state(node: Node, state: Any, cfg: TelemetryConfig) -> None:
    """Give a job's ``state`` (a ``JobState``) what telemetry started for ``cfg`` on
    ``node`` (the client's):
    ``query_engine_client``, and ``dashboard_url`` with ``include_dashboard``
    (starting the dashboard now if it is not running yet). Leaves what the job's own
    ``_state()`` set; does nothing when telemetry did not start for ``cfg``."""
    if active_config() is not cfg:
        return
    ext = node.part(Extensions)
    if state.query_engine_client is None and ext.query_engine_client is not None:
        state.query_engine_client = ext.query_engine_client()
    if cfg.include_dashboard and state.dashboard_url is None and ext.dashboard_url is not None:
        try:
            state.dashboard_url = ext.dashboard_url()
        except (ImportError, OSError, ValueError) as e:  # best effort, as start()
            warnings.warn(
                f"the dashboard could not start; the job runs without it: {e}",
                RuntimeWarning,
                stacklevel=3,
            )


class ActiveTelemetry:
    """Node part: the configuration of the job whose ``state()`` last started telemetry
    in this session, and the settings it changed, put back when the session ends (the
    OpenTelemetry providers stay: they are the process's, by OpenTelemetry's design)."""

    def __init__(self) -> None:
        self.config: TelemetryConfig | None = None
        self.previous: dict[str, Any] | None = None  # the settings before start() changed them

    def on_node_end(self) -> None:
        if self.previous is not None:
            config.configure(**self.previous)
            self.previous = None


def active_config() -> TelemetryConfig | None:
    """The configuration telemetry was last started with in this session (None: never)."""
    node = this_node(start=False)
    return None if node is None else node.part(ActiveTelemetry).config


def make_config(config_: TelemetryConfig | None, kwargs: dict[str, Any]) -> TelemetryConfig:
    """``enable_telemetry``'s arguments as one ``TelemetryConfig``."""
    if config_ is not None:
        if kwargs:
            raise TypeError(
                f"enable_telemetry() takes a TelemetryConfig or its fields as keywords, not "
                f"both (got config and {sorted(kwargs)})"
            )
        if not isinstance(config_, TelemetryConfig):
            raise TypeError(f"enable_telemetry() needs a TelemetryConfig, got {config_!r}")
        return config_
    fields = {f.name for f in dataclasses.fields(TelemetryConfig)}
    unknown = sorted(set(kwargs) - fields)
    if unknown:
        raise TypeError(
            f"enable_telemetry() got unknown fields {unknown}; TelemetryConfig has {sorted(fields)}"
        )
    return TelemetryConfig(**kwargs)


def start(node: Node, cfg: TelemetryConfig) -> bool:
    """Start telemetry on ``node`` (the client's) as ``cfg`` says (``state()`` calls
    this); False, with a ``RuntimeWarning``, when it cannot start."""
    part = node.part(ActiveTelemetry)
    if part.previous is None:
        part.previous = {k: config.get(k) for k in ("telemetry", "dashboard", "dashboard_port")}
    try:
        telemetry.enable()
        config.configure(telemetry=True)  # procs spawned from now on turn it on too
    except (ImportError, ValueError) as e:
        # Best effort, as Monarch's: said where the user sees it, and the job goes on.
        warnings.warn(
            f"telemetry could not start; the job runs without it: {e}", RuntimeWarning, stacklevel=3
        )
        return False
    if cfg.include_dashboard:
        config.configure(dashboard=True, dashboard_port=cfg.dashboard_port)
    part.config = cfg
    keep = node.part(Extensions).start_history
    if keep is not None:
        try:
            keep(cfg.retention_secs, cfg.snapshot_interval_secs)
        except (ImportError, OSError) as e:  # best effort: the live tables still answer
            warnings.warn(
                f"telemetry history could not start; queries read the live procs only: {e}",
                RuntimeWarning,
                stacklevel=3,
            )
    return True


@dataclasses.dataclass
class MeshAdminConfig:
    """Monarch's configuration of its mesh admin server, for ``enable_telemetry(
    mesh_admin_config=...)``. Accepted so that Monarch programs run; danaus has no
    mesh admin server (its dashboard and ``danaus top``/``stack`` show the mesh),
    so passing one has no effect and warns ``NoEffectWarning``.
    """

    admin_addr: str | None = None
