"""Where logs live on a host: one directory per job, one file per proc, and danaus's own log.

Layout (on every host that runs procs of the job)::

    <log_dir>/<job>/                  job = the client's name (the same on every host)
        <proc>.log                    everything the proc wrote to stdout and stderr
        <proc>.json                   {"proc", "label", "coords", "host", "pid", "started"}
        danaus.log                    danaus's own diagnostics (client, agents, procs)

``<log_dir>`` is the ``log_dir`` setting, by default ``logs`` in the per-user
directory of the system's temporary directory. Directories are private to
the user. Pure file-system code: the host agent writes, ``danaus logs`` reads.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import time
from dataclasses import dataclass
from typing import Any

from ... import _config as config
from ..._transport.address import private_base
from ..._transport.owned import private_dir

__all__ = [
    "CurrentStderrHandler",
    "ProcLog",
    "base_dir",
    "configure_danaus_logging",
    "find_job",
    "job_dir",
    "parse_coords",
    "read_procs",
    "write_meta",
]


def base_dir() -> str:
    """The directory holding every job's log directory on this host (``logs/`` in this
    user's private base directory unless ``log_dir`` says otherwise)."""
    return config.get("log_dir") or os.path.join(private_base(), "logs")


def _private(path: str) -> str:
    return private_dir(path, "the log directory")


def job_dir(job: str) -> str:
    """The log directory of job ``job`` on this host (created; old ones pruned on creation)."""
    base = _private(base_dir())
    path = os.path.join(base, job)
    if not os.path.isdir(path):
        _prune(base)
    return _private(path)


def _prune(base: str) -> None:
    """Delete job directories nobody wrote to for longer than ``log_retention``."""
    keep = config.get("log_retention")
    if not keep:
        return
    cutoff = time.time() - keep
    try:
        entries = list(os.scandir(base))
    except OSError:
        return
    for e in entries:
        try:
            if e.is_dir(follow_symlinks=False) and e.stat().st_mtime < cutoff:
                shutil.rmtree(e.path, ignore_errors=True)
        except OSError:
            pass


def write_meta(directory: str, proc: str, meta: dict[str, Any]) -> None:
    """Write (or rewrite) the description of proc ``proc``'s log file."""
    path = os.path.join(directory, proc + ".json")
    tmp = path + ".tmp"
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        json.dump(meta, f)
    os.replace(tmp, path)


@dataclass(frozen=True)
class ProcLog:
    """One proc's log file and what it is."""

    proc: str
    label: str
    coords: str  # "hosts=1,gpus=3" ("" for a proc alone)
    host: str
    path: str
    started: float

    @property
    def prefix(self) -> str:
        return format_prefix(self.label, self.coords)


def format_prefix(label: str, coords: str) -> str:
    """``[trainer {hosts=1,gpus=3}]`` (``[trainer]`` for a proc without coordinates)."""
    return f"[{label} {{{coords}}}]" if coords else f"[{label}]"


def parse_coords(text: str) -> dict[str, int]:
    """``"hosts=1,gpus=3"`` -> ``{"hosts": 1, "gpus": 3}``; ``ValueError`` naming a bad part."""
    out: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.strip().strip("{}").split(","))):
        name, eq, value = part.partition("=")
        if not eq or not name.strip() or not value.strip().lstrip("-").isdigit():
            raise ValueError(
                f"bad coordinate {part!r} in {text!r}: write dimension=index pairs separated "
                "by commas, like 'hosts=1,gpus=3'"
            )
        out[name.strip()] = int(value)
    return out


def read_procs(directory: str) -> list[ProcLog]:
    """The procs with a log file in a job's directory, by label then coordinates."""
    found = []
    for name in os.listdir(directory):
        if not name.endswith(".json"):
            continue
        try:
            with open(os.path.join(directory, name)) as f:
                meta = json.load(f)
        except (OSError, ValueError):
            continue
        proc = meta.get("proc", name[:-5])
        found.append(
            ProcLog(
                proc,
                str(meta.get("label", "")),
                str(meta.get("coords", "")),
                str(meta.get("host", "")),
                os.path.join(directory, proc + ".log"),
                float(meta.get("started", 0.0)),
            )
        )

    def key(p: ProcLog) -> tuple[Any, ...]:
        try:
            coords = tuple(parse_coords(p.coords).values())
        except ValueError:
            coords = ()
        return (p.label, coords, p.started, p.proc)

    return sorted(found, key=key)


def find_job(job: str | None) -> str:
    """The log directory of ``job`` (a job name, a unique prefix of one, or a path);
    the most recently written one when ``job`` is None. ``FileNotFoundError`` explains."""
    if job and os.path.isdir(job):
        return job
    base = base_dir()
    try:
        dirs = [e for e in os.scandir(base) if e.is_dir()]
    except FileNotFoundError:
        dirs = []
    if not dirs:
        raise FileNotFoundError(
            f"no job logs under {base} (set DANAUS_LOG_DIR if the job used another directory)"
        )
    if job is None:
        return max(dirs, key=lambda e: e.stat().st_mtime).path
    matches = [e for e in dirs if e.name == job] or [e for e in dirs if e.name.startswith(job)]
    if len(matches) != 1:
        names = ", ".join(sorted(e.name for e in dirs)[:20])
        what = "no job" if not matches else "several jobs"
        raise FileNotFoundError(f"{what} named {job!r} under {base}; the jobs there: {names}")
    return matches[0].path


#: A record logged with ``extra={NOTIFY: True}`` needs the user (a restart, say): it is
#: printed to stderr whatever ``log_stderr_level`` says, by the client and by a proc (whose
#: stderr reaches the client's terminal, prefixed), as well as written to ``danaus.log``.
NOTIFY = "danaus_notify"


class CurrentStderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is at the time (tests and notebooks swap it)."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: object) -> None:
        pass


class _StderrHandler(CurrentStderrHandler):
    """Writes to the current ``sys.stderr`` records from ``threshold`` up, and every
    ``NOTIFY`` record (``threshold`` None: only those)."""

    def __init__(self, threshold: int | None = None) -> None:
        super().__init__()
        self.threshold = threshold

    def filter(self, record: logging.LogRecord) -> bool:
        wanted = getattr(record, NOTIFY, False) or (
            self.threshold is not None and record.levelno >= self.threshold
        )
        return bool(wanted) and bool(super().filter(record))


_FORMAT = "%(asctime)s %(process)d %(name)s %(levelname)s: %(message)s"


def _level(name: str, setting: str) -> int:
    value = logging.getLevelName(str(name).upper())
    if not isinstance(value, int):
        raise ValueError(
            f"{setting} is {name!r}, not a logging level; use DEBUG, INFO, WARNING, ERROR "
            "or CRITICAL"
        )
    return value


def configure_danaus_logging(directory: str, *, to_stderr: bool) -> None:
    """Send the ``danaus`` loggers to ``danaus.log`` in ``directory``, not the user's terminal.

    With ``to_stderr`` (the client), records from ``log_stderr_level`` up are
    also printed to stderr: errors the user needs to see. Records marked ``NOTIFY``
    (events the user must hear of, such as a restart) are printed to stderr in every
    process, once each: a proc's stderr is forwarded to the client's terminal. Does
    nothing if the user has given the ``danaus`` logger handlers of their own.
    """
    logger = logging.getLogger("danaus")
    if any(not getattr(h, "_danaus", False) for h in logger.handlers):
        return
    for h in list(logger.handlers):
        logger.removeHandler(h)
        h.close()
    file_level = _level(config.get("log_file_level"), "log_file_level")
    handlers: list[logging.Handler] = []
    try:
        fh: logging.Handler = logging.FileHandler(os.path.join(directory, "danaus.log"), delay=True)
        fh.setLevel(file_level)
        handlers.append(fh)
    except OSError:
        pass
    threshold = _level(config.get("log_stderr_level"), "log_stderr_level") if to_stderr else None
    sh = _StderrHandler(threshold)
    # NOTIFY records are warnings: the handler sees them whatever the threshold.
    sh.setLevel(logging.WARNING if threshold is None else min(threshold, logging.WARNING))
    handlers.append(sh)
    for h in handlers:
        h.setFormatter(logging.Formatter(_FORMAT))
        h._danaus = True  # type: ignore[attr-defined]
        logger.addHandler(h)
    logger.setLevel(min([file_level, *(h.level for h in handlers)]))
    logger.propagate = False
