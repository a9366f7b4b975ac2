"""``danaus logs``: print or follow the per-proc log files of a job on this host."""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, TextIO

from .. import _config as config
from .._runtime.logs import dirs as logdir

__all__ = ["add_logs_command", "run_logs_command"]

_EPILOG = """\
examples:
  danaus logs                         every proc of the latest job, one after the other
  danaus logs --mesh trainer -c gpus=3
                                      the procs of mesh 'trainer' with gpus=3 (any hosts)
  danaus logs -f -n 20                the last 20 lines of each proc, then new lines as
                                      they come (Ctrl-C ends)
  danaus logs --list c1a2b3           the procs of job c1a2b3 and their files

Each host keeps the files of the procs it ran, under $DANAUS_LOG_DIR (default:
logs/ in the per-user directory of the system's temporary directory); run this
on the host you want to read.
"""


def add_logs_command(sub: Any) -> None:
    p = sub.add_parser(
        "logs",
        help="print or follow the output of a job's procs (from the log files on this host)",
        description="Print the per-proc log files of a job, each line prefixed with its "
        "mesh and coordinates like [trainer {hosts=1,gpus=3}].",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "job",
        nargs="?",
        help="job name (or a unique prefix, or a directory); default: the latest job",
    )
    p.add_argument("--mesh", "-m", help="only procs of the mesh with this name")
    p.add_argument(
        "--coords",
        "-c",
        help="only procs at these coordinates, e.g. 'hosts=1,gpus=3' "
        "(dimensions left out match any index)",
    )
    p.add_argument("--follow", "-f", action="store_true", help="keep printing new lines")
    p.add_argument("--lines", "-n", type=int, help="only the last N lines of each proc")
    p.add_argument("--list", "-l", action="store_true", help="list the procs and their files")


def _select(args: argparse.Namespace, directory: str) -> list[logdir.ProcLog]:
    want = logdir.parse_coords(args.coords) if args.coords else {}
    out = []
    for p in logdir.read_procs(directory):
        if args.mesh is not None and p.label != args.mesh:
            continue
        try:
            have = logdir.parse_coords(p.coords)
        except ValueError:
            have = {}
        if any(have.get(k) != v for k, v in want.items()):
            continue
        out.append(p)
    return out


def _last_lines(path: str, n: int) -> tuple[bytes, int]:
    """The last ``n`` lines of the file and the offset where the file ends."""
    with open(path, "rb") as f:
        end = f.seek(0, os.SEEK_END)
        block, data, pos = 65536, b"", end
        while pos > 0 and data.count(b"\n") <= n:
            pos = max(0, pos - block)
            f.seek(pos)
            data = f.read(end - pos)
    lines = data.split(b"\n")
    if lines and not lines[-1]:
        lines.pop()
    keep = lines[-n:] if n > 0 else []
    return b"".join(line + b"\n" for line in keep), end


def _emit(out: TextIO, prefix: str, data: bytes) -> None:
    text = data.decode("utf-8", "replace")
    lines = text.split("\n")
    if lines and not lines[-1]:
        lines.pop()
    if lines:
        out.write("".join(f"{prefix} {line}\n" for line in lines))
        out.flush()


def run_logs_command(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    try:
        directory = logdir.find_job(args.job)
        procs = _select(args, directory)
    except (FileNotFoundError, ValueError) as e:
        print(f"danaus logs: {e}", file=sys.stderr)
        return 2
    if args.lines is not None and args.lines < 0:
        print(f"danaus logs: --lines must be >= 0, got {args.lines}", file=sys.stderr)
        return 2
    if args.list:
        for p in procs:
            size = os.path.getsize(p.path) if os.path.exists(p.path) else 0
            out.write(f"{p.prefix} {p.proc} host={p.host} {size} bytes {p.path}\n")
        return 0
    if not procs and not args.follow:
        print(f"danaus logs: no proc matches in {directory}", file=sys.stderr)
        return 1
    offsets: dict[str, int] = {}
    for p in procs:
        offsets[p.proc] = _print_file(out, p, args.lines)
    if not args.follow:
        return 0
    try:
        _follow(args, directory, out, offsets)
    except KeyboardInterrupt:
        pass
    return 0


def _print_file(out: TextIO, p: logdir.ProcLog, lines: int | None) -> int:
    """Print a proc's file (or its last ``lines``); returns the offset reached."""
    if not os.path.exists(p.path):
        return 0
    if lines is not None:
        data, end = _last_lines(p.path, lines)
        _emit(out, p.prefix, data)
        return end
    end, rest = 0, b""
    with open(p.path, "rb") as f:
        while data := f.read(1 << 20):
            data = rest + data
            cut = data.rfind(b"\n") + 1
            _emit(out, p.prefix, data[:cut])
            rest = data[cut:]
            end += cut
    _emit(out, p.prefix, rest)  # a last line still being written
    return end


def _follow(args: argparse.Namespace, directory: str, out: TextIO, offsets: dict[str, int]) -> None:
    interval = config.get("log_follow_interval")
    while True:
        for p in _select(args, directory):
            start = offsets.get(p.proc, 0)
            try:
                size = os.path.getsize(p.path)
            except OSError:
                continue
            if size < start:  # rotated: start the new file from its beginning
                start = 0
            if size == start:
                offsets[p.proc] = size
                continue
            with open(p.path, "rb") as f:
                f.seek(start)
                data = f.read(size - start)
            cut = data.rfind(b"\n") + 1  # whole lines only: the rest comes next time
            if cut:
                _emit(out, p.prefix, data[:cut])
            offsets[p.proc] = start + cut
        time.sleep(interval)
