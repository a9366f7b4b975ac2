#!/usr/bin/env python3
"""Run the danaus benchmarks, the physical floor and the installed comparators; print a table.

    python benchmarks/run.py                 # full run, every system that is installed
    python benchmarks/run.py --smoke         # small sizes, and the regression guard (CI)
    python benchmarks/run.py --smoke --write-baseline   # record the guard's baseline
    python benchmarks/run.py --systems danaus,floor --workloads call_one,crash

Each (system, workload) runs in its own worker process (``systems/<system>_bench.py``)
under that system's interpreter: this one for danaus and the floor,
``benchmarks/.envs/<name>/bin/python`` for the comparators (made by
``setup_comparators.sh``). Systems alternate workload by workload, round after
round (the order rotates each round), and each worker is killed, with its whole
process group, if it outlives its workload's time limit: it is then reported as
"timeout", not left hanging. The results go to ``benchmarks/results/<timestamp>.json``
(or ``--json PATH``) and a plain-text table is printed.

In smoke mode the run ends with a guard against silent regressions: danaus's
ratio to the floor (measured in the same run, pairs of worker runs side by
side) for spawn, call_one, throughput and the 16 MiB payload, each against
the ratio recorded in ``baseline.json``. The exit code is 1 when one is worse
than ``GUARD_MARGIN`` (2) times its recorded ratio in each of ``GUARD_TRIES``
(3) runs of it, or could not be measured; ``--no-guard`` skips the check,
``--write-baseline`` records new ratios instead (see README.md).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import math
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from workloads import (  # noqa: E402
    BY_NAME,
    COMPARATORS,
    GUARD_MARGIN,
    GUARD_TRIES,
    GUARDED,
    LARGE,
    SYSTEMS,
    TARGETS,
    VARIANTS,
    WORKLOADS,
    Workload,
    system_runs,
)

MARKER = "BENCH_RESULT "
ENVS = HERE / ".envs"
BASELINE = HERE / "baseline.json"

# How each workload is shown: (unit label, factor applied to the worker's number).
DISPLAY: dict[str, tuple[str, float]] = {
    "spawn": ("ms", 1e3),
    "call_one": ("us", 1e6),
    "throughput": ("calls/s", 1.0),
    "plain_throughput": ("calls/s", 1.0),
    "plain_throughput_notorch": ("calls/s", 1.0),
    "gather": ("us", 1e6),
    "gather64": ("us", 1e6),
    "spawn64": ("ms", 1e3),
    "payload_1MiB": ("MiB/s", 1.0),
    "payload_16MiB": ("MiB/s", 1.0),
    "payload_128MiB": ("MiB/s", 1.0),
    **{name: ("MiB/s", 1.0) for name in LARGE},
    "error": ("us", 1e6),
    "crash": ("ms", 1e3),
    "memory": ("MB", 1e-6),
}

# ----------------------------------------------------------------------------- systems


def _comparator_python(name: str, override: str | None) -> Path:
    return Path(override) if override else ENVS / name / "bin" / "python"


def _probe(python: Path, dist: str) -> tuple[bool, str]:
    """Is ``dist`` installed for ``python``? Returns (ok, version or reason)."""
    if not python.exists():
        return False, f"no interpreter at {python}"
    code = f"import importlib.metadata as m, sys\nprint(m.version({dist!r}))\n"
    try:
        r = subprocess.run(
            [str(python), "-c", code], capture_output=True, text=True, timeout=60, env=_clean_env()
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"could not run {python}: {e}"
    if r.returncode != 0:
        return False, f"{dist} is not installed for {python}"
    return True, r.stdout.strip()


def _clean_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env.pop("PYTHONHOME", None)
    return env


def _worker_env(system: str) -> dict[str, str]:
    env = _clean_env()
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONWARNINGS"] = "ignore"  # library warnings must not turn into errors in workers
    if system == "danaus" or system in VARIANTS:
        env.update(VARIANTS.get(system, {}))
        # The code under test is this checkout's, whether or not it is installed.
        src = str(REPO / "src")
        old = os.environ.get("PYTHONPATH")
        env["PYTHONPATH"] = src if not old else f"{src}{os.pathsep}{old}"
    if system == "ray":
        env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # bind to 127.0.0.1
        env["RAY_USAGE_STATS_ENABLED"] = "0"
    return env


def discover(
    wanted: list[str], monarch_python: str | None, ray_python: str | None
) -> dict[str, dict[str, Any]]:
    """Which systems can run, with which interpreter, and why not when they cannot."""
    out: dict[str, dict[str, Any]] = {}
    for name in wanted:
        if name in ("floor", "danaus") or name in VARIANTS:
            info: dict[str, Any] = {"available": True, "python": sys.executable}
            if name == "danaus" or name in VARIANTS:
                info["version"] = _danaus_version()
            out[name] = info
            continue
        py = _comparator_python(name, monarch_python if name == "monarch" else ray_python)
        dist = "torchmonarch" if name == "monarch" else "ray"
        ok, detail = _probe(py, dist)
        if ok:
            out[name] = {"available": True, "python": str(py), "version": detail}
        else:
            out[name] = {
                "available": False,
                "python": str(py),
                "message": (
                    f"{name} skipped: {detail}. Install it with "
                    f"`bash benchmarks/setup_comparators.sh {name}`."
                ),
            }
    return out


def _danaus_version() -> str:
    code = "import danaus; print(getattr(danaus, '__version__', '?'))"
    try:
        r = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=60,
            env=_worker_env("danaus"),
        )
        return r.stdout.strip() or f"import failed: {r.stderr.strip()[-300:]}"
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unknown ({e})"


# ----------------------------------------------------------------------------- workers


def run_worker(
    system: str, python: str, wl: Workload, smoke: bool, timeout: float
) -> dict[str, Any]:
    """Run one worker; never raises for the worker's failures, never waits past ``timeout``."""
    script = HERE / "systems" / f"{'danaus' if system in VARIANTS else system}_bench.py"
    cmd = [python, str(script), "--workload", wl.name, "--smoke" if smoke else "--full"]
    t0 = time.monotonic()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
            cwd=str(HERE / "systems"),
            env=_worker_env(system),
            start_new_session=True,  # its own process group: killed whole on timeout
        )
        timed_out = False
        try:
            rc: int | None = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
            rc = proc.returncode
        _kill_group(proc, grace=0.0, only_leftovers=True)
        wall = time.monotonic() - t0
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()

    rec: dict[str, Any] | None = None
    for line in stdout.splitlines():
        if line.startswith(MARKER):
            with contextlib.suppress(json.JSONDecodeError):
                rec = json.loads(line[len(MARKER) :])
    result: dict[str, Any] = {"wall_s": round(wall, 3), "rc": rc}
    if rec is not None:
        result.update(
            samples=rec.get("samples") or [],
            work=rec.get("work"),
            extra=rec.get("extra") or {},
            error=rec.get("error"),
        )
        if timed_out:
            result["note"] = (
                f"reported, then hung while shutting down (killed after {timeout:.0f} s)"
            )
        elif rc not in (0, None) and not rec.get("error"):
            result["note"] = f"reported, then exited with code {rc}"
        result["status"] = "ok" if result["samples"] and not result["error"] else "error"
    elif timed_out:
        result.update(status="timeout", samples=[], error=f"no result within {timeout:.0f} s")
    else:
        result.update(
            status="error",
            samples=[],
            error=f"exited with code {rc} without a result; stderr tail:\n{stderr[-1500:]}",
        )
    if result["status"] != "ok":
        result["stderr_tail"] = stderr[-3000:]
    return result


def _kill_group(
    proc: subprocess.Popen[Any], grace: float = 3.0, only_leftovers: bool = False
) -> None:
    """SIGTERM, then SIGKILL, the worker's process group (it and what it started)."""
    pgid = proc.pid  # start_new_session=True made the worker its group's leader
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 0.0)):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            break
        if only_leftovers and sig == signal.SIGTERM:
            time.sleep(0.2)
        elif wait:
            try:
                proc.wait(wait)
            except subprocess.TimeoutExpired:
                pass
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)


# ----------------------------------------------------------------------------- statistics


def percentile(xs: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), q in [0, 100]."""
    s = sorted(xs)
    if not s:
        return math.nan
    k = (len(s) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summarize(wl: Workload, samples: list[float], work: float | None) -> dict[str, Any]:
    """Median and p99 in the workload's display unit (for rates: at the median and p99 time)."""
    unit, factor = DISPLAY[wl.name]
    med, p99 = percentile(samples, 50), percentile(samples, 99)
    if wl.kind == "rate":
        w = work or 1.0
        return {
            "unit": unit,
            "n": len(samples),
            "median": w / med,
            "p99": w / p99,  # the rate of the slow tail
            "best": w / min(samples),
            "median_s": med,
            "p99_s": p99,
            "higher_is_better": True,
        }
    return {
        "unit": unit,
        "n": len(samples),
        "median": med * factor,
        "p99": p99 * factor,
        "min": min(samples) * factor,
        "max": max(samples) * factor,
        "higher_is_better": False,
    }


# ----------------------------------------------------------------------------- the run


def _cpu_ticks() -> tuple[int, int] | None:
    """(all CPU ticks, stolen ticks) from ``/proc/stat``; None where there is none."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
        ticks = [int(x) for x in fields]
    except (OSError, ValueError):
        return None
    # user nice system idle iowait irq softirq steal guest guest_nice: guest time is
    # already counted in user and nice.
    return sum(ticks[:8]), ticks[7] if len(ticks) > 7 else 0


def _steal_pct(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    if before is None or after is None or after[0] <= before[0]:
        return None
    return round(100.0 * (after[1] - before[1]) / (after[0] - before[0]), 1)


def _steal_s(meta: dict[str, Any]) -> str:
    steal = meta.get("steal_pct")
    if steal is None:
        return ""
    rounds = [f"{x}%" for x in meta.get("steal_pct_rounds") or [] if x is not None]
    return f"; CPU stolen by the hypervisor: {steal}%" + (
        f" (rounds: {', '.join(rounds)})" if rounds else ""
    )


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
    }
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                info["memory_gib"] = round(int(line.split()[1]) / 2**20, 1)
    return info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--smoke", action="store_true", help="tiny sizes, one round (CI)")
    mode.add_argument("--full", action="store_true", help="the real sizes (default)")
    ap.add_argument(
        "--systems",
        default=",".join(SYSTEMS),
        help=f"comma-separated, from {','.join(SYSTEMS)} (default: all; "
        "comparators that are not installed are skipped)",
    )
    ap.add_argument("--workloads", default="all", help=f"comma-separated, from {','.join(BY_NAME)}")
    ap.add_argument("--rounds", type=int, default=None, help="rounds (default: 3 full, 1 smoke)")
    ap.add_argument(
        "--json",
        default=None,
        help="where to write the JSON (default: benchmarks/results/<timestamp>.json)",
    )
    ap.add_argument(
        "--max-minutes",
        type=float,
        default=None,
        help="no new round starts, and no worker, past this (default: 10 full, 3 smoke, "
        "10 with --write-baseline)",
    )
    ap.add_argument(
        "--monarch-python",
        default=None,
        help="interpreter with torchmonarch (default: benchmarks/.envs/monarch/bin/python)",
    )
    ap.add_argument(
        "--ray-python",
        default=None,
        help="interpreter with ray (default: benchmarks/.envs/ray/bin/python)",
    )
    ap.add_argument(
        "--strict",
        action="store_true",
        help="exit 1 if a workload of an available system produced no number",
    )
    ap.add_argument(
        "--no-guard",
        action="store_true",
        help="smoke mode: do not compare the ratios to the floor with baseline.json",
    )
    ap.add_argument(
        "--write-baseline",
        action="store_true",
        help="smoke mode: write this run's ratios to the floor as the guard's new baseline "
        "(commit it saying why)",
    )
    ap.add_argument(
        "--baseline",
        default=str(BASELINE),
        help="the guard's baseline file (default: benchmarks/baseline.json)",
    )
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    ap.add_argument(
        "--render", metavar="JSON", default=None, help="print the table of an earlier run"
    )
    a = ap.parse_args(argv)
    if a.render:
        print(render(json.loads(Path(a.render).read_text())))
        return 0

    smoke = bool(a.smoke)
    if a.write_baseline and not smoke:
        ap.error("--write-baseline records smoke-mode ratios: use it with --smoke")
    rounds = a.rounds if a.rounds is not None else (1 if smoke else 3)
    # A baseline is recorded over several smoke rounds: the smoke default would cut them.
    default_minutes = 3 if smoke and not a.write_baseline else 10
    max_s = 60.0 * (a.max_minutes if a.max_minutes is not None else default_minutes)
    systems = [s.strip() for s in a.systems.split(",") if s.strip()]
    bad = [s for s in systems if s not in SYSTEMS]
    if bad:
        ap.error(f"unknown system(s) {bad}; choose from {SYSTEMS}")
    if a.workloads == "all":
        wls = list(WORKLOADS)
    else:
        names = [w.strip() for w in a.workloads.split(",") if w.strip()]
        unknown = [n for n in names if n not in BY_NAME]
        if unknown:
            ap.error(f"unknown workload(s) {unknown}; choose from {list(BY_NAME)}")
        wls = [BY_NAME[n] for n in names]

    def say(msg: str) -> None:
        if not a.quiet:
            print(msg, flush=True)

    started = time.monotonic()
    stamp = _dt.datetime.now(_dt.timezone.utc)
    load_before = os.getloadavg()
    cpu_before = _cpu_ticks()
    steal_rounds: list[float | None] = []
    avail = discover(systems, a.monarch_python, a.ray_python)
    for info in avail.values():
        if not info["available"]:
            say(info["message"])
    active = [s for s in systems if avail[s]["available"]]

    raw: dict[str, dict[str, list[dict[str, Any]]]] = {
        w.name: {s: [] for s in active if system_runs(s, w.name)} for w in wls
    }
    rounds_done = 0
    skipped_note: str | None = None
    last_round_s = 0.0
    for r in range(rounds):
        elapsed = time.monotonic() - started
        if r > 0 and elapsed + last_round_s > max_s:
            skipped_note = (
                f"stopped after {rounds_done} of {rounds} rounds: another round "
                f"(~{last_round_s:.0f} s) would pass --max-minutes"
            )
            say(skipped_note)
            break
        round_start = time.monotonic()
        round_cpu = _cpu_ticks()
        order = active[r % len(active) :] + active[: r % len(active)] if active else []
        for wl in wls:
            run_workload(wl, order, avail, smoke, r, raw[wl.name], say, started + max_s)
        rounds_done += 1
        last_round_s = time.monotonic() - round_start
        steal_rounds.append(_steal_pct(round_cpu, _cpu_ticks()))

    results = aggregate(wls, active, raw)
    targets = evaluate_targets(results, avail)
    doc = {
        "meta": {
            "date": stamp.isoformat(timespec="seconds"),
            "mode": "smoke" if smoke else "full",
            "rounds_requested": rounds,
            "rounds_done": rounds_done,
            "note": skipped_note,
            "wall_s": round(time.monotonic() - started, 1),
            "machine": machine_info(),
            # Other work on the machine skews the numbers: the 1/5/15-minute load averages.
            "loadavg_before": [round(x, 2) for x in load_before],
            "loadavg_after": [round(x, 2) for x in os.getloadavg()],
            # CPU time the hypervisor gave to others while we wanted it (a shared VM's
            # noise, which the load average does not show): % of all CPU time.
            "steal_pct": _steal_pct(cpu_before, _cpu_ticks()),
            "steal_pct_rounds": steal_rounds,
            "command": " ".join(
                [Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]
            ),
        },
        "systems": avail,
        "workloads": {
            w.name: {"title": w.title, "kind": w.kind, "unit": DISPLAY[w.name][0]} for w in wls
        },
        "results": results,
        "targets": targets,
        "raw": raw,
    }
    path = Path(a.json) if a.json else HERE / "results" / f"{stamp.strftime('%Y%m%dT%H%M%SZ')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, default=_json_default))

    print()
    print(render(doc))
    guard_failed = False
    if smoke and a.write_baseline:
        written = write_baseline(Path(a.baseline), raw, doc["meta"])
        if not written:
            print(
                "\nno baseline written: no guarded workload has numbers for danaus and the "
                f"floor ({', '.join(GUARDED)})",
                file=sys.stderr,
            )
            return 1
        print(f"\nbaseline written to {a.baseline}: {_ratios_s(written)}")
    elif smoke and not a.no_guard:
        rows = check_guard(raw, load_baseline(Path(a.baseline)))
        reruns: dict[str, list[dict[str, Any]]] = {}

        def rerun(name: str) -> dict[str, dict[str, list[dict[str, Any]]]]:
            say(f"guard: {name} looks regressed; measuring it again")
            got: dict[str, list[dict[str, Any]]] = {"floor": [], "danaus": []}
            run_workload(BY_NAME[name], ["floor", "danaus"], avail, smoke, 0, got, say, None)
            reruns.setdefault(name, []).append(got)
            return {name: got}

        for row in rows:
            confirm(row, rerun)
        doc["guard"] = rows
        doc["guard_reruns"] = reruns
        path.write_text(json.dumps(doc, indent=1, default=_json_default))
        print()
        print(render_guard(rows, a.baseline))
        guard_failed = any(r["failed"] for r in rows)
    print(f"\nJSON written to {path}")
    if guard_failed:
        print("guard: a ratio to the floor regressed (see above)", file=sys.stderr)
        return 1
    if a.strict:
        missing = [
            f"{w}/{s}"
            for w, per in results.items()
            for s, v in per.items()
            if v.get("median") is None
        ]
        if missing:
            print(f"no number for: {', '.join(missing)}", file=sys.stderr)
            return 1
    return 0


def run_workload(
    wl: Workload,
    order: list[str],
    avail: dict[str, dict[str, Any]],
    smoke: bool,
    r: int,
    sink: dict[str, list[dict[str, Any]]],
    say: Any,
    deadline: float | None,
) -> None:
    """Run ``wl`` on each system of ``order`` that runs it, ``processes`` times over
    (fresh client processes, systems alternating); append each result to ``sink``."""
    p = wl.params(smoke)
    for _ in range(p.processes):
        for s in order:
            if s not in sink:
                continue
            if deadline is not None and time.monotonic() > deadline:
                res = {"status": "skipped", "samples": [], "error": "run deadline passed"}
            else:
                res = run_worker(s, avail[s]["python"], wl, smoke, p.timeout_s)
            res["round"] = r
            sink[s].append(res)
            say(_progress(r, wl, s, res))


def _json_default(o: Any) -> Any:
    if isinstance(o, float) and not math.isfinite(o):
        return None
    return str(o)


def _progress(r: int, wl: Workload, s: str, res: dict[str, Any]) -> str:
    head = f"[round {r + 1}] {wl.name:<15} {s:<8}"
    if res["status"] == "ok":
        st = summarize(wl, res["samples"], res.get("work"))
        tail = f" {st['median']:.4g} {st['unit']} median of {st['n']} ({res['wall_s']:.1f} s)"
        if res.get("note"):
            tail += f"  [{res['note']}]"
        return head + tail
    first = (res.get("error") or "").strip().splitlines()
    return head + f" {res['status'].upper()}: {first[0][:160] if first else ''}"


def aggregate(
    wls: list[Workload], active: list[str], raw: dict[str, dict[str, list[dict[str, Any]]]]
) -> dict[str, dict[str, dict[str, Any]]]:
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for wl in wls:
        per: dict[str, dict[str, Any]] = {}
        for s in active:
            if s not in raw[wl.name]:
                continue
            runs = raw[wl.name][s]
            samples = [x for r in runs if r["status"] == "ok" for x in r["samples"]]
            works = {r.get("work") for r in runs if r["status"] == "ok"}
            statuses = [r["status"] for r in runs]
            entry: dict[str, Any] = {"statuses": statuses}
            if samples:
                entry.update(summarize(wl, samples, next(iter(works)) if works else None))
            else:
                entry.update(median=None, p99=None, n=0, unit=DISPLAY[wl.name][0])
                entry["failure"] = next(
                    (r["status"] for r in runs if r["status"] != "ok"), "no samples"
                )
                errs = [r.get("error") for r in runs if r.get("error")]
                if errs:
                    entry["error"] = errs[0][:2000]
            notes = sorted({r["note"] for r in runs if r.get("note")})
            if notes:
                entry["notes"] = notes
            extras = [r.get("extra") for r in runs if r.get("extra")]
            if extras:
                entry["extra"] = _merge_extra(extras)
            per[s] = entry
        out[wl.name] = per
    return out


def _merge_extra(extras: list[dict[str, Any]]) -> dict[str, Any]:
    keep = (
        "socket_mib_s",
        "client_torch",
        "torch_loaded",
        "client_survived",
        "errors_seen",
        "error_types",
        "not_noticed",
        "what",
        "bytes",
        "stop_errors",
        "client_errors_after_crash",
        "pss",
        "client_rise_mib",
        "proc_rise_mib",
    )
    out: dict[str, Any] = {}
    for k in keep:
        vals = [e[k] for e in extras if k in e]
        if not vals:
            continue
        if k in ("torch_loaded",):
            out[k] = any(vals)
        elif k == "client_torch":  # "imported", or why not, in each run
            out[k] = next((v for v in vals if v != "imported"), "imported")
        elif k == "client_survived":
            out[k] = (
                all(v for v in vals if v is not None) if any(v is not None for v in vals) else None
            )
        elif k == "socket_mib_s":
            out[k] = sorted(vals)[len(vals) // 2]
        elif k in ("client_rise_mib", "proc_rise_mib"):
            out[k] = max(vals)  # the worst run's peak
        elif k == "not_noticed":
            out[k] = sum(vals)
        elif k in ("errors_seen", "error_types", "stop_errors", "client_errors_after_crash"):
            # proc and actor ids differ run to run: fold them so alike messages merge
            folded = {re.sub(r"\bp[0-9a-f]{8}\b", "p<id>", x) for v in vals for x in v}
            out[k] = sorted(folded)[:5]
        elif k == "pss":
            out["pss_mb_max"] = (
                round(max(x for v in vals for x in v if x) / 1e6, 1)
                if any(any(v) for v in vals)
                else None
            )
        else:
            out[k] = vals[0]
    return out


def ratio(
    results: dict[str, dict[str, dict[str, Any]]],
    wl: str,
    against: str,
    system: str = "danaus",
    against_stat: str | None = None,
) -> float | None:
    """``system``'s median over ``against``'s (or over the figure ``against_stat`` of
    ``against``'s extra, e.g. the floor's raw socketpair rate)."""
    per = results.get(wl, {})
    d, o = per.get(system, {}).get("median"), per.get(against, {}).get("median")
    if against_stat is not None:
        o = per.get(against, {}).get("extra", {}).get(against_stat)
    if d is None or o is None or o == 0:
        return None
    return float(d) / float(o)


def evaluate_targets(
    results: dict[str, dict[str, dict[str, Any]]], avail: dict[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for t in TARGETS:
        row: dict[str, Any] = {
            "target": t.text,
            "workload": t.workload,
            "against": t.against,
            "op": t.op,
            "bound": t.bound,
        }
        if t.workload not in results:
            row.update(status="not run", value=None)
        elif t.against is None:
            d = results[t.workload].get("danaus", {})
            v = d.get("max") if t.stat == "max" else d.get("median")
            if v is not None:
                v = v / DISPLAY[t.workload][1] if t.workload == "memory" else v
            row["value"] = v
            row["status"] = _judge(v, t.op, t.bound)
            if t.workload == "memory" and d.get("extra", {}).get("torch_loaded"):
                row["status"] += " (torch was loaded in the proc)"
        else:
            missing = [
                s for s in (t.against, t.system) if s not in avail or not avail[s]["available"]
            ]
            if missing:
                row.update(status=f"n/a ({missing[0]} not run)", value=None)
            else:
                v = ratio(results, t.workload, t.against, t.system, t.extra.get("against_stat"))
                row["value"] = v
                row["status"] = _judge(v, t.op, t.bound)
        out.append(row)
    return out


def _judge(v: float | None, op: str, bound: float) -> str:
    if v is None:
        return "no number"
    ok = {"<=": v <= bound, ">=": v >= bound, "<": v < bound}[op]
    return "met" if ok else "MISSED"


# ----------------------------------------------------------------------------- the guard


def load_baseline(path: Path) -> dict[str, Any]:
    """The recorded ratios (``{"ratios": {workload: ratio}, ...}``); empty if none."""
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    return doc if isinstance(doc, dict) else {}


def pair_ratios(
    raw: dict[str, dict[str, list[dict[str, Any]]]], wl: str, rounds: set[int] | None = None
) -> list[float]:
    """danaus / floor for each pair of worker runs that ran one after the other.

    The k-th danaus run of a round is paired with the k-th floor run of that
    round (a workload's ``processes`` alternate the systems), each on its best
    sample: least time, or for rates the fastest batch, with each run's own
    amount of work. On a loaded machine the slow samples measure the
    scheduler (two smoke runs gave call_one medians of 6x and 28x the floor,
    best samples 7.6x and 8.2x), and two runs side by side see alike loads.
    """
    rate = BY_NAME[wl].kind == "rate"
    by_round: dict[int, dict[str, list[dict[str, Any]]]] = {}
    for system in ("danaus", "floor"):
        for run in raw.get(wl, {}).get(system, []):
            by_round.setdefault(run["round"], {}).setdefault(system, []).append(run)
    out: list[float] = []
    for rnd, runs in sorted(by_round.items()):
        if rounds is not None and rnd not in rounds:
            continue
        for d, f in zip(runs.get("danaus", []), runs.get("floor", []), strict=False):
            if not (d["status"] == "ok" and f["status"] == "ok" and d["samples"] and f["samples"]):
                continue
            dv, fv = min(d["samples"]), min(f["samples"])
            if rate:
                out.append(((d.get("work") or 1.0) / dv) / ((f.get("work") or 1.0) / fv))
            else:
                out.append(dv / fv)
    return out


def guard_ratio(
    raw: dict[str, dict[str, list[dict[str, Any]]]], wl: str, rounds: set[int] | None = None
) -> float | None:
    """The median of ``pair_ratios``; None when no pair has numbers on both sides."""
    vals = pair_ratios(raw, wl, rounds)
    return percentile(vals, 50) if vals else None


def _limit(wl: str, base: float | None, margin: float) -> float | None:
    if base is None:
        return None
    return base / margin if BY_NAME[wl].kind == "rate" else base * margin


def _within(wl: str, value: float, limit: float) -> bool:
    return value >= limit if BY_NAME[wl].kind == "rate" else value <= limit


def check_guard(
    raw: dict[str, dict[str, list[dict[str, Any]]]],
    baseline: dict[str, Any],
    margin: float = GUARD_MARGIN,
) -> list[dict[str, Any]]:
    """One row per guarded workload that ran: ``guard_ratio`` against the baseline.

    ``failed`` when the ratio is worse than ``margin`` times the recorded one
    (times: higher; rates: lower), or when a workload that ran gave no ratio
    (danaus or the floor produced no number). A workload without a recorded
    ratio, or not run, never fails. ``confirm`` (in ``main``) runs a failed one
    again before the run fails.
    """
    recorded = baseline.get("ratios") or {}
    rows: list[dict[str, Any]] = []
    for wl in GUARDED:
        per = raw.get(wl)
        if per is None or "danaus" not in per or "floor" not in per:
            continue  # not run (--workloads or --systems left it out)
        value = guard_ratio(raw, wl)
        base = recorded.get(wl)
        limit = _limit(wl, base, margin)
        if value is None:
            status, failed = "NO NUMBER", True
        elif limit is None:
            status, failed = "no baseline", False
        elif _within(wl, value, limit):
            status, failed = "ok", False
        else:
            status, failed = "REGRESSED", True
        rows.append(
            {
                "workload": wl,
                "ratio": value,
                "pairs": pair_ratios(raw, wl),
                "baseline": base,
                "limit": limit,
                "higher_is_better": BY_NAME[wl].kind == "rate",
                "status": status,
                "failed": failed,
                "tries": [value],
            }
        )
    return rows


def confirm(
    row: dict[str, Any], rerun: Any, tries: int = GUARD_TRIES, margin: float = GUARD_MARGIN
) -> None:
    """Run a failed row's workload again, up to ``tries`` runs in all; it passes if any
    run is within the limit (a regression shows in every run, a burst of load on a
    shared machine in one). ``rerun(wl)`` returns the raw results of one more run."""
    wl = row["workload"]
    while row["failed"] and len(row["tries"]) < tries:
        value = guard_ratio(rerun(wl), wl)
        row["tries"].append(value)
        if value is not None and row["limit"] is not None and _within(wl, value, row["limit"]):
            row.update(ratio=value, failed=False, status=f"ok (run {len(row['tries'])})")


def render_guard(rows: list[dict[str, Any]], where: str) -> str:
    if not rows:
        return "guard: nothing to check (it needs danaus and the floor, and a guarded workload)"
    table = [["guard: danaus/floor", "ratio", "pairs", "baseline", "limit", "status"]]
    for r in rows:
        op = ">=" if r["higher_is_better"] else "<="
        limit = "-" if r["limit"] is None else f"{op} {_ratio_s(r['limit'])}"
        base = "-" if r["baseline"] is None else _ratio_s(r["baseline"])
        pairs = " ".join(_ratio_s(x) for x in r["pairs"]) or "-"
        status = r["status"]
        if len(r["tries"]) > 1:
            status += " (runs: " + ", ".join(_ratio_s(x) for x in r["tries"]) + ")"
        table.append([r["workload"], _ratio_s(r["ratio"]), pairs, base, limit, status])
    return (
        "guard against silent regressions: danaus/floor, the median over pairs of worker runs "
        "side by side, each on its best sample; it fails beyond "
        f"{GUARD_MARGIN:g}x the ratio recorded in {where} (rates: higher is better, times: "
        f"lower), in each of {GUARD_TRIES} runs\n" + _table(table)
    )


def write_baseline(
    path: Path, raw: dict[str, dict[str, list[dict[str, Any]]]], meta: dict[str, Any]
) -> dict[str, float]:
    """Record the guarded ratios as the baseline; returns them.

    Each is the worst of the run's rounds (``--rounds N``), each round's being
    ``guard_ratio``: the limit, twice that, then lies beyond the noise those
    rounds saw, not only beyond their middle.
    """
    ratios: dict[str, float] = {}
    per_round: dict[str, list[float]] = {}
    for wl in GUARDED:
        rounds = sorted({r["round"] for r in raw.get(wl, {}).get("danaus", [])})
        vals = [v for v in (guard_ratio(raw, wl, {n}) for n in rounds) if v is not None]
        if not vals:
            continue
        worst = min(vals) if BY_NAME[wl].kind == "rate" else max(vals)
        ratios[wl] = float(f"{worst:.4g}")
        per_round[wl] = [float(f"{v:.4g}") for v in vals]
    if not ratios:
        return ratios  # nothing measured against the floor: the file is left as it was
    doc = {
        "about": (
            "danaus/floor ratios of `benchmarks/run.py --smoke` (run.py's guard_ratio: the "
            "median over pairs of worker runs side by side, each on its best sample: least "
            "time for spawn and call_one, the fastest batch for throughput and payload_16MiB, "
            "as rates), the worst of the recording run's rounds (all of them in per_round). "
            f"The smoke run fails when a ratio is worse than {GUARD_MARGIN:g}x the one here "
            f"in {GUARD_TRIES} runs of it. Re-record with `python benchmarks/run.py --smoke "
            "--systems danaus,floor --workloads spawn,call_one,throughput,payload_16MiB "
            "--rounds 5 --write-baseline` and commit saying why."
        ),
        "recorded": meta.get("date"),
        "command": meta.get("command"),
        "rounds": meta.get("rounds_done"),
        "machine": meta.get("machine"),
        "loadavg_before": meta.get("loadavg_before"),
        "steal_pct": meta.get("steal_pct"),
        "ratios": ratios,
        "per_round": per_round,
    }
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return ratios


def _ratios_s(ratios: dict[str, float]) -> str:
    return ", ".join(f"{k} {_ratio_s(v)}" for k, v in ratios.items()) or "none"


# ----------------------------------------------------------------------------- rendering


def _num(x: float | None) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    ax = abs(x)
    if ax >= 1000:
        return f"{x:,.0f}"
    if ax >= 100:
        return f"{x:.0f}"
    if ax >= 10:
        return f"{x:.1f}"
    if ax >= 1:
        return f"{x:.2f}"
    return f"{x:.3g}"


def _ratio_s(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.3g}x"


def _cell(entry: dict[str, Any] | None) -> str:
    if entry is None:
        return "-"
    if entry.get("median") is None:
        return entry.get("failure", "-")
    return f"{_num(entry['median'])} ({_num(entry['p99'])})"


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for j, r in enumerate(rows):
        lines.append(
            "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w)
                for i, (c, w) in enumerate(zip(r, widths, strict=True))
            )
        )
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def render(doc: dict[str, Any]) -> str:
    results = doc["results"]
    systems = [s for s in SYSTEMS if s in doc["systems"] and doc["systems"][s]["available"]]
    others = [s for s in systems if s != "danaus"]
    header = ["workload", "unit", *systems]
    ratio_cols = ["floor", *COMPARATORS, *VARIANTS]
    if "danaus" in systems:
        header += [f"danaus/{s}" for s in ratio_cols if s in others]
    rows = [header]
    for wl, per in results.items():
        unit = doc["workloads"][wl]["unit"]
        better = "higher" if per and next(iter(per.values())).get("higher_is_better") else ""
        if not better:
            better = "higher" if BY_NAME[wl].kind == "rate" else "lower"
        row = [wl, f"{unit} ({'^' if better == 'higher' else 'v'})"]
        row += [_cell(per.get(s)) for s in systems]
        if "danaus" in systems:
            row += [_ratio_s(ratio(results, wl, s)) for s in ratio_cols if s in others]
        rows.append(row)
    meta = doc["meta"]
    m = meta["machine"]
    parts = [
        f"danaus benchmarks, {meta['mode']} mode, {meta['date']}, {meta['rounds_done']} round(s), "
        f"{meta['wall_s']} s",
        f"machine: {m.get('cpu', '?')}, {m.get('cpus')} cpus, {m.get('memory_gib')} GiB, "
        f"Python {m.get('python')}; load average before/after: "
        f"{meta.get('loadavg_before', ['?'])[0]} / {meta.get('loadavg_after', ['?'])[0]}"
        + _steal_s(meta),
        "versions: "
        + ", ".join(
            f"{s} {doc['systems'][s].get('version', '')}".strip() for s in systems if s != "floor"
        ),
        "cells: median (p99); for rates the p99 column is the rate of the slow (p99) tail; "
        "^ higher is better, v lower is better",
        "",
        _table(rows),
    ]
    skipped = [info["message"] for info in doc["systems"].values() if not info["available"]]
    if skipped:
        parts += ["", *skipped]
    if doc.get("targets") and "danaus" in systems:
        trows = [["target", "value", "status"]]
        for t in doc["targets"]:
            v = t.get("value")
            if v is None:
                vs = "-"
            elif t["against"] is None:
                vs = f"{v / 1e6:.1f} MB" if t["workload"] == "memory" else _num(v)
            else:
                vs = _ratio_s(v)
            trows.append([t["target"], vs, t["status"]])
        parts += ["", _table(trows)]
    notes = []
    for wl, per in results.items():
        for s, e in per.items():
            ex = e.get("extra", {})
            if wl == "crash" and ex.get("client_survived") is False:
                notes.append(f"{s}: the client did not survive an actor crash")
            if wl == "crash" and ex.get("not_noticed"):
                notes.append(f"{s}: {ex['not_noticed']} crash(es) not noticed in time")
            if s == "floor" and ex.get("socket_mib_s"):
                notes.append(
                    f"floor {wl}: raw socketpair transfer to another process (reference, not "
                    f"the floor column): {_num(ex['socket_mib_s'])} MiB/s"
                )
            if ex.get("client_rise_mib") is not None:
                notes.append(
                    f"{s} {wl}: rise of the peak resident size: client "
                    f"{_num(ex['client_rise_mib'])} MiB, proc {_num(ex['proc_rise_mib'])} MiB"
                )
            if wl == "memory" and ex.get("torch_loaded"):
                notes.append(f"{s}: torch was loaded in the idle proc")
            if ex.get("client_torch") not in (None, "imported"):
                notes.append(
                    f"{s} {wl}: measured without torch in the client ({ex['client_torch'][:160]})"
                )
            bad = [st for st in e.get("statuses", []) if st != "ok"]
            if bad and e.get("median") is not None:
                notes.append(
                    f"{s} {wl}: {len(bad)} of {len(e['statuses'])} runs gave no number "
                    f"({', '.join(sorted(set(bad)))}); the cell pools the others"
                )
            for n in e.get("notes", []):
                notes.append(f"{s} {wl}: {n}")
            if e.get("median") is None and e.get("error"):
                notes.append(
                    f"{s} {wl}: {e['failure']}: {e['error'].strip().splitlines()[0][:200]}"
                )
    if notes:
        parts += ["", "notes:", *[f"  - {n}" for n in notes]]
    return "\n".join(parts)


if __name__ == "__main__":
    sys.exit(main())
