#!/usr/bin/env python3
"""Speed across hosts, danaus beside Monarch on the same lab hosts (issue 44 §2).

    sudo .venv/bin/python benchmarks/multihost_bench.py              # 4 hosts x 4 procs, 2 rounds
    sudo .venv/bin/python benchmarks/multihost_bench.py --smoke      # tiny: proves the harness
    sudo .venv/bin/python benchmarks/multihost_bench.py --rate 1gbit --systems danaus

The hosts are those of the project's host lab (``danaus._netlab``: network
namespaces on one bridge, links shaped with ``tc``). For each system and round
the driver starts that system's worker in every host's namespace, as a user
does on machines without a scheduler (danaus: ``python -m danaus worker``
through ``_netlab_workers.start_worker``; Monarch: ``run_worker_loop_forever(address=
"tcp://HOST:26600", ca="trust_all_connections")``), then runs the client
(``systems/multihost_client.py``, under the system's interpreter) in the root
namespace, which attaches to them with ``attach_to_workers`` and times:

- ``spawn``: ``spawn_procs(per_host={"gpus": P})`` on all hosts, one actor each, a gather;
- ``call_one``: sequential round trips to one actor on another host;
- ``throughput``: 10,000 ``call_one`` to it issued without waiting, then all awaited;
- ``gather``: ``call().get()`` over all H x P actors;
- ``broadcast``: 200 ``broadcast()`` to all actors, then one gather that checks they all arrived;
- ``bulk``: 256 MiB from a proc on host 0 to a proc on host 1 over the data plane
  (``RDMABuffer.read_into``, timed in the reader), beside ``iperf3`` on the same link.

Systems alternate within each round (the order rotates), and each round runs
``iperf3`` between the same two hosts. Every process of a system's run (its
workers, their procs, its client) is in a cgroup of its own, so each figure
comes with the CPU that system used meanwhile (``cores``: CPU seconds / wall
seconds), beside the whole machine's busy cores and stolen time (other work on
this shared machine shows there). A last run spawns 8 x 8 = 64 procs for
correctness only (one network namespace per host, every answer right).

Needs root (namespaces, cgroups). Prints a table, writes JSON to
``benchmarks/results/multihost-<timestamp>.json`` (``--json``). Exit code 1 if a
workload of an available system failed (``--strict``: or a target was missed).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import os
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "src"))

from danaus import _netlab, _netlab_workers  # noqa: E402

CLIENT = HERE / "systems" / "multihost_client.py"
MONARCH_PORT = 26600
MAIN_WORKLOADS = ["spawn", "call_one", "throughput", "gather", "broadcast", "bulk"]
MARK = "MH_RESULT "
MiB = 1 << 20

# How each workload is shown: unit, and the figure from (median seconds, ops per sample).
UNITS: dict[str, tuple[str, Any]] = {
    "attach": ("ms", lambda s, n: s * 1e3),
    "spawn": ("ms", lambda s, n: s * 1e3),
    "call_one": ("us", lambda s, n: s * 1e6),
    "throughput": ("calls/s", lambda s, n: n / s),
    "gather": ("us", lambda s, n: s * 1e6),
    "broadcast": ("us/bcast", lambda s, n: s / n * 1e6),
    "bulk": ("MiB/s", lambda s, n: n / s / MiB),
}
HIGHER_IS_BETTER = {"throughput", "bulk"}
# danaus / Monarch on the medians (issue 44 §2: the single-host ratios hold across hosts).
TARGETS = {"call_one": ("<=", 0.25), "gather": ("<=", 0.25), "throughput": (">=", 8.0)}
BULK_VS_IPERF = 0.8  # danaus's host-to-host bulk / iperf3's on the same link

_MONARCH_WORKER = (
    "import sys\n"
    "from monarch.actor import run_worker_loop_forever\n"
    "run_worker_loop_forever(address=sys.argv[1], ca='trust_all_connections')\n"
)


# -- CPU accounting: a cgroup per run ---------------------------------------------------

CG_PREFIX = "dnbench-"


def _cgroup_root() -> tuple[Path, str] | None:
    """(directory under which to make groups, the file with their CPU use), or None."""
    v1 = Path("/sys/fs/cgroup/cpuacct")
    if (v1 / "cpuacct.usage").exists() and os.access(v1, os.W_OK):
        return v1, "cpuacct.usage"
    v2 = Path("/sys/fs/cgroup")
    if (v2 / "cgroup.controllers").exists() and os.access(v2, os.W_OK):
        return v2, "cpu.stat"
    return None


class CpuGroup:
    """A cgroup holding every process of one system's run; ``usage_file`` counts their CPU."""

    def __init__(self, path: Path, usage_file: str) -> None:
        self.path = path
        self.usage_file = str(path / usage_file)

    @classmethod
    def make(cls, label: str) -> CpuGroup | None:
        root = _cgroup_root()
        if root is None:
            return None
        sweep_cgroups()
        path = root[0] / f"{CG_PREFIX}{os.getpid()}-{label}-{secrets.token_hex(2)}"
        path.mkdir()
        return cls(path, root[1])

    def join(self, pid: int | None = None) -> None:
        (self.path / "cgroup.procs").write_text(str(pid or os.getpid()))

    @contextlib.contextmanager
    def joined(self) -> Iterator[None]:
        """This process in the group meanwhile (what it starts stays there)."""
        home = _own_cgroup(self.path.parent)
        self.join()
        try:
            yield
        finally:
            (home / "cgroup.procs").write_text(str(os.getpid()))

    def pids(self) -> list[int]:
        try:
            return [int(x) for x in (self.path / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    def destroy(self) -> int:
        """SIGKILL what is still in the group 5 s on, remove it; returns how many were."""
        deadline = time.monotonic() + 5
        while [p for p in self.pids() if p != os.getpid()] and time.monotonic() < deadline:
            time.sleep(0.05)
        left = [p for p in self.pids() if p != os.getpid()]
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 20
        while self.pids() and time.monotonic() < deadline:
            time.sleep(0.05)
        with contextlib.suppress(OSError):
            self.path.rmdir()
        return len(left)


def _own_cgroup(root: Path) -> Path:
    """Where this process is now, in the hierarchy mounted at ``root``."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, rel = line.split(":", 2)
        names = controllers.split(",")
        if (root.name in names) or (controllers == "" and root == Path("/sys/fs/cgroup")):
            return root / rel.lstrip("/")
    return root


def sweep_cgroups() -> None:
    """Remove the groups of runs whose driver died (their processes killed first)."""
    root = _cgroup_root()
    if root is None:
        return
    for path in root[0].glob(f"{CG_PREFIX}*"):
        owner = path.name[len(CG_PREFIX) :].split("-", 1)[0]
        if owner.isdigit() and not os.path.exists(f"/proc/{owner}"):
            CpuGroup(path, root[1]).destroy()


def machine_load() -> dict[str, Any]:
    with open("/proc/loadavg") as f:
        la = f.read().split()[:3]
    return {"loadavg": [float(x) for x in la], "utc": _dt.datetime.now(_dt.UTC).isoformat()}


# -- workers ------------------------------------------------------------------------


def _wait_listening(host: _netlab.Host, port: int, proc: subprocess.Popen[Any], t: float) -> None:
    deadline = time.monotonic() + t
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the Monarch worker in {host.netns} exited ({proc.returncode})")
        with contextlib.suppress(OSError), socket.create_connection((host.ip, port), timeout=1):
            return
        time.sleep(0.1)
    raise RuntimeError(f"the Monarch worker in {host.netns} did not listen within {t} s")


def _clean_env() -> dict[str, str]:
    return {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYTHONHOME") and not k.startswith("DANAUS_")
    }


class SystemRun:
    """One system's workers on ``hosts`` and its client, in a cgroup of their own."""

    def __init__(self, system: str, python: str, hosts: list[_netlab.Host], label: str) -> None:
        self.system = system
        self.python = python
        self.hosts = hosts
        self.secret = secrets.token_hex(32)
        self.group = CpuGroup.make(label)
        self.danaus_workers: list[_netlab_workers.Worker] = []
        self.monarch_workers: list[subprocess.Popen[Any]] = []
        # The Monarch workers' output, kept for the run and closed by close().
        self.logs = tempfile.TemporaryFile("w+")  # noqa: SIM115

    def _preexec(self) -> None:
        if self.group is not None:
            self.group.join()

    def start_workers(self) -> list[str]:
        if self.system == "danaus":
            ctx = self.group.joined() if self.group is not None else contextlib.nullcontext()
            with ctx:
                for h in self.hosts:
                    self.danaus_workers.append(_netlab_workers.start_worker(h, self.secret))
            return [w.address for w in self.danaus_workers]
        addrs = []
        for h in self.hosts:
            addr = f"tcp://{h.ip}:{MONARCH_PORT}"
            argv = h.exec_argv(self.python, "-c", _MONARCH_WORKER, addr)
            proc = subprocess.Popen(
                [*_netlab.DIE_WITH_PARENT, *argv],
                stdin=subprocess.DEVNULL,
                stdout=self.logs,
                stderr=subprocess.STDOUT,
                env=_clean_env(),
                start_new_session=True,
                preexec_fn=self._preexec,
            )
            self.monarch_workers.append(proc)
            addrs.append(addr)
        for h, proc in zip(self.hosts, self.monarch_workers, strict=True):
            _wait_listening(h, MONARCH_PORT, proc, 60)
        return addrs

    def run_client(
        self,
        workers: list[str],
        gateway: str,
        procs: int,
        workloads: list[str],
        smoke: bool,
        timeout: float,
    ) -> tuple[list[dict[str, Any]], str]:
        env = _clean_env()
        env["PYTHONUNBUFFERED"] = "1"
        if self.group is not None:
            env["DNBENCH_CPU_FILE"] = self.group.usage_file
        if self.system == "danaus":
            env["DANAUS_SECRET"] = self.secret
            env["PYTHONPATH"] = str(REPO / "src")
        cmd = [self.python, str(CLIENT), "--system", self.system, "--workers", ",".join(workers)]
        cmd += ["--client-ip", gateway, "--procs", str(procs), "--workloads", ",".join(workloads)]
        cmd += ["--smoke"] if smoke else []
        with tempfile.TemporaryFile("w+") as out:
            proc = subprocess.Popen(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=str(CLIENT.parent),
                env=env,
                start_new_session=True,
                preexec_fn=self._preexec,
            )
            note = ""
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                note = f"timeout: the client was killed after {timeout:g} s"
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            out.seek(0)
            text = out.read()
        rows = [json.loads(x[len(MARK) :]) for x in text.splitlines() if x.startswith(MARK)]
        if proc.returncode not in (0, 1) and not note:
            note = f"the client exited with {proc.returncode}"
        if note:
            note += "; its output ends: " + text[-1500:]
        return rows, note

    def close(self) -> int:
        """Stop the workers (and their procs); returns the processes the group still held."""
        for w in self.danaus_workers:
            with contextlib.suppress(Exception):
                _netlab_workers.reap(w)
        for p in self.monarch_workers:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        self.logs.close()
        return self.group.destroy() if self.group is not None else 0


def run_system(
    system: str,
    python: str,
    hosts: list[_netlab.Host],
    gateway: str,
    procs: int,
    workloads: list[str],
    smoke: bool,
    timeout: float,
    label: str,
) -> dict[str, Any]:
    run = SystemRun(system, python, hosts, label)
    rows: list[dict[str, Any]] = []
    note = ""
    t0 = time.monotonic()
    try:
        workers = run.start_workers()
        rows, note = run.run_client(workers, gateway, procs, workloads, smoke, timeout)
    except Exception as e:
        note = f"{type(e).__name__}: {e}"
    finally:
        left = run.close()
    return {
        "system": system,
        "hosts": len(hosts),
        "procs_per_host": procs,
        "rows": rows,
        "note": note,
        "left_in_cgroup_after_workers_stopped": left,
        "cgroup": run.group is not None,
        "seconds": time.monotonic() - t0,
    }


# -- iperf3 ---------------------------------------------------------------------------


def iperf3(a: _netlab.Host, b: _netlab.Host, seconds: float) -> dict[str, Any]:
    """One TCP stream from ``a`` to ``b`` for ``seconds``: MiB/s received, CPU % of each end."""
    exe = shutil.which("iperf3")
    if exe is None:
        return {"error": "iperf3 is not installed (scripts/install-services, as root)"}
    port = "5201"
    server = subprocess.Popen(
        [*_netlab.DIE_WITH_PARENT, *b.exec_argv(exe, "-s", "-B", b.ip, "-p", port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            r = subprocess.run(
                a.exec_argv(exe, "-c", b.ip, "-p", port, "-t", f"{seconds:g}", "-J"),
                capture_output=True,
                text=True,
                timeout=seconds + 30,
            )
            try:
                doc = json.loads(r.stdout or "{}")
            except ValueError:
                doc = {"error": f"unreadable output: {r.stdout[-300:]!r}"}
            end = doc.get("end") or {}
            if "sum_received" in end:
                return {
                    "mib_s": end["sum_received"]["bits_per_second"] / 8 / MiB,
                    "cpu_sender_pct": end["cpu_utilization_percent"]["host_total"],
                    "cpu_receiver_pct": end["cpu_utilization_percent"]["remote_total"],
                    "seconds": seconds,
                }
            if time.monotonic() > deadline or server.poll() is not None:
                why = doc.get("error") or r.stderr.strip() or f"exit {r.returncode}"
                return {"error": f"iperf3 {a.ip} -> {b.ip}: {why}"}
            time.sleep(0.2)  # the server was not listening yet
    finally:
        if server.poll() is None:
            server.kill()
        server.wait()


# -- summary ---------------------------------------------------------------------------


def pooled(runs: list[dict[str, Any]], system: str, wl: str) -> dict[str, Any] | None:
    samples: list[float] = []
    ops = 0
    cpu = wall = machine = steal = 0.0
    done = 0
    cpu_known = True
    errors = []
    for r in runs:
        if r["system"] != system:
            continue
        for row in r["rows"]:
            if row["workload"] != wl:
                continue
            if row.get("error"):
                errors.append(row["error"])
                continue
            samples += row["samples"]
            ops = row["ops"]
            wall += row.get("wall_s") or 0.0
            if row.get("cpu_s") is None:
                cpu_known = False
            else:
                cpu += row["cpu_s"]
            machine += row.get("machine_cpu_s") or 0.0
            steal += row.get("machine_steal_s") or 0.0
            done += row.get("ops_done") or 0
        if r["note"] and not any(row["workload"] == wl for row in r["rows"]):
            errors.append(r["note"])
    if not samples:
        return {"errors": errors} if errors else None
    med = statistics.median(samples)
    unit, conv = UNITS[wl]
    return {
        "value": conv(med, ops),
        "unit": unit,
        "samples": len(samples),
        "median_s": med,
        "ops": ops,
        "cores": (cpu / wall) if cpu_known and wall else None,
        "cpu_ms_per_op": (cpu / done * 1e3) if cpu_known and done else None,
        "machine_cores": machine / wall if wall else None,
        "steal_cores": steal / wall if wall else None,
        "errors": errors,
    }


def _fmt(x: float | None, unit: str = "") -> str:
    if x is None:
        return "-"
    if unit == "calls/s" or x >= 1000:
        return f"{x:,.0f}"
    return f"{x:.3g}" if x < 100 else f"{x:.0f}"


def summarize(doc: dict[str, Any]) -> tuple[list[str], list[dict[str, Any]]]:
    runs = doc["runs"]
    systems = doc["meta"]["systems"]
    lines = []
    checks: list[dict[str, Any]] = []
    head = f"{'workload':<11} {'unit':<9}"
    for s in systems:
        head += f" {s:>12} {'cores':>6} {'cpu ms/op':>9}"
    head += f" {'machine':>7} {'ratio':>8} {'cpu/op':>7}  target"
    lines += [head, "-" * len(head)]
    table: dict[str, dict[str, Any]] = {}
    for wl in ["attach", *MAIN_WORKLOADS]:
        cells = {s: pooled(runs, s, wl) for s in systems}
        table[wl] = cells
        unit = UNITS[wl][0]
        line = f"{wl:<11} {unit:<9}"
        machine = []
        for s in systems:
            c = cells[s]
            if c is None or "value" not in c:
                line += f" {'failed' if c else '-':>12} {'':>6} {'':>9}"
                continue
            line += f" {_fmt(c['value'], unit):>12} {_fmt(c['cores']):>6} "
            line += f"{_fmt(c['cpu_ms_per_op']):>9}"
            if c["machine_cores"] is not None:
                machine.append(c["machine_cores"])
        line += f" {_fmt(max(machine) if machine else None):>7}"
        d, m = cells.get("danaus"), cells.get("monarch")
        ratio = None
        if d and m and "value" in d and "value" in m and m["value"]:
            ratio = d["value"] / m["value"]
        line += f" {(f'{ratio:.3g}x' if ratio is not None else '-'):>8}"
        cpu_ratio = None  # danaus's CPU per operation / Monarch's
        if d and m and d.get("cpu_ms_per_op") and m.get("cpu_ms_per_op"):
            cpu_ratio = d["cpu_ms_per_op"] / m["cpu_ms_per_op"]
        line += f" {(f'{cpu_ratio:.3g}x' if cpu_ratio is not None else '-'):>7}"
        if wl in TARGETS:
            op, limit = TARGETS[wl]
            ok = None if ratio is None else (ratio <= limit if op == "<=" else ratio >= limit)
            verdict = "-" if ok is None else "ok" if ok else "MISSED"
            line += f"  {op} {limit:g}x vs monarch: {verdict}"
            checks.append({"workload": wl, "ratio": ratio, "target": f"{op} {limit}", "ok": ok})
        lines.append(line)
    # bulk beside iperf3 on the same link (pooled medians)
    ip = [r["mib_s"] for r in doc["iperf3"] if "mib_s" in r]
    if ip:
        ref = statistics.median(ip)
        cpu = statistics.median(
            r["cpu_sender_pct"] + r["cpu_receiver_pct"] for r in doc["iperf3"] if "mib_s" in r
        )
        lines.append(
            f"{'iperf3':<11} {'MiB/s':<9} {_fmt(ref):>12} {cpu / 100:>6.2f}  (one TCP "
            f"stream, host 0 -> host 1, {len(ip)} runs; cores = sender + receiver)"
        )
        for s in systems:
            c = table["bulk"].get(s)
            if c and "value" in c:
                frac = c["value"] / ref
                tail = ""
                if s == "danaus":
                    ok = frac >= BULK_VS_IPERF
                    tail = f"  >= {BULK_VS_IPERF:g} of iperf3: {'ok' if ok else 'MISSED'}"
                    checks.append(
                        {
                            "workload": "bulk_vs_iperf3",
                            "ratio": frac,
                            "target": f">= {BULK_VS_IPERF}",
                            "ok": ok,
                        }
                    )
                lines.append(f"  bulk {s}/iperf3 = {frac:.3g}{tail}")
    else:
        lines.append(f"iperf3: {[r.get('error') for r in doc['iperf3']]}")
    doc["table"] = table
    return lines, checks


# -- main ----------------------------------------------------------------------------


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, one round")
    ap.add_argument("--systems", default="danaus,monarch")
    ap.add_argument("--workloads", default=",".join(MAIN_WORKLOADS))
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--procs", type=int, default=4, help="procs per host")
    ap.add_argument("--rounds", type=int, default=None, help="default 2 (smoke: 1)")
    ap.add_argument("--big", default="8x8", help="hosts x procs of the correctness run ('' none)")
    ap.add_argument("--big-systems", default="danaus")
    ap.add_argument("--rate", default=_netlab.DATACENTER.rate, help="tc rate of each link")
    ap.add_argument("--delay-us", type=float, default=None, help="one way (needs netem)")
    ap.add_argument("--loss", type=float, default=0.0, help="percent, each direction")
    ap.add_argument("--iperf-seconds", type=float, default=3.0)
    ap.add_argument("--monarch-python", default=str(HERE / ".envs" / "monarch" / "bin" / "python"))
    ap.add_argument("--client-timeout", type=float, default=None, help="s (default 600, smoke 180)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    ap.add_argument("--render", metavar="JSON", help="print the table of an earlier run's JSON")
    a = ap.parse_args(argv)
    if a.procs * a.hosts > 16 and not a.smoke:
        ap.error("timed runs stay at 16 procs or fewer on this 2-core machine (use --big)")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    if a.render:
        lines, _ = summarize(json.loads(Path(a.render).read_text()))
        print("\n".join(lines))
        return 0
    if os.geteuid() != 0:
        print("multihost_bench needs root (network namespaces, cgroups)", file=sys.stderr)
        return 2
    rounds = a.rounds if a.rounds is not None else (1 if a.smoke else 2)
    timeout = a.client_timeout or (180.0 if a.smoke else 600.0)
    wanted = [s for s in a.systems.split(",") if s]
    pythons = {"danaus": sys.executable, "monarch": a.monarch_python}
    systems, skipped = [], {}
    for s in wanted:
        if s not in pythons:
            print(f"unknown system {s!r} (danaus, monarch)", file=sys.stderr)
            return 2
        if not Path(pythons[s]).exists():
            skipped[s] = (
                f"no {pythons[s]}: install it with `bash benchmarks/setup_comparators.sh {s}`"
            )
            print(f"{s} skipped: {skipped[s]}", file=sys.stderr)
        else:
            systems.append(s)
    big = tuple(int(x) for x in a.big.split("x")) if a.big else None
    workloads = [w for w in a.workloads.split(",") if w]
    need = max(a.hosts, 2, big[0] if big else 0)
    delay = (
        0.0
        if not _netlab.netem_available()
        else (_netlab.DATACENTER.delay_us if a.delay_us is None else a.delay_us)
    )
    link = _netlab.Link(delay_us=delay, rate=a.rate, loss_pct=a.loss)
    doc: dict[str, Any] = {
        "meta": {
            "mode": "smoke" if a.smoke else "full",
            "systems": systems,
            "skipped": skipped,
            "hosts": a.hosts,
            "procs_per_host": a.procs,
            "rounds": rounds,
            "link": {
                "delay_us": link.delay_us,
                "rate": link.rate,
                "loss_pct": link.loss_pct,
                "shaper": "netem" if _netlab.netem_available() else "tbf (no sch_netem)",
            },
            "cpus": os.cpu_count(),
            "cgroup": _cgroup_root() is not None,
            "load_before": machine_load(),
        },
        "runs": [],
        "iperf3": [],
        "big": [],
    }

    def terminated(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)  # through the teardown below

    signal.signal(signal.SIGTERM, terminated)
    t0 = time.monotonic()
    with _netlab_workers.lab(need, link, workers=False) as (net, _):
        hosts = net.hosts[: a.hosts]
        doc["meta"]["hosts_ip"] = [h.ip for h in net.hosts]
        doc["meta"]["client_ip"] = net.gateway
        for r in range(rounds):
            order = systems[r % len(systems) :] + systems[: r % len(systems)] if systems else []
            for s in order:
                print(
                    f"round {r + 1}/{rounds}: {s} on {len(hosts)} hosts x {a.procs} procs",
                    file=sys.stderr,
                    flush=True,
                )
                res = run_system(
                    s,
                    pythons[s],
                    hosts,
                    net.gateway,
                    a.procs,
                    workloads,
                    a.smoke,
                    timeout,
                    f"{s}-r{r}",
                )
                res["round"] = r
                res["load_after"] = machine_load()
                doc["runs"].append(res)
                if res["note"]:
                    print(f"  {s}: {res['note'][:2000]}", file=sys.stderr)
            if "bulk" in workloads:
                try:
                    got = iperf3(net.hosts[0], net.hosts[1], a.iperf_seconds)
                except Exception as e:
                    got = {"error": f"{type(e).__name__}: {e}"}
                doc["iperf3"].append(got)
        if big:
            for s in [x for x in a.big_systems.split(",") if x in systems]:
                print(
                    f"correctness: {s} on {big[0]} hosts x {big[1]} procs",
                    file=sys.stderr,
                    flush=True,
                )
                res = run_system(
                    s,
                    pythons[s],
                    net.hosts[: big[0]],
                    net.gateway,
                    big[1],
                    ["correct"],
                    a.smoke,
                    timeout,
                    f"{s}-big",
                )
                doc["big"].append(res)
    doc["meta"]["load_after"] = machine_load()
    doc["meta"]["seconds"] = time.monotonic() - t0

    lines, checks = summarize(doc)
    doc["checks"] = checks
    ld = doc["meta"]
    print(
        f"\nmultihost_bench ({ld['mode']}): {a.hosts} hosts x {a.procs} procs, "
        f"{rounds} round(s), "
        f"link {link.rate}, delay {link.delay_us:g} us ({ld['link']['shaper']}), "
        f"loss {link.loss_pct:g}%; load {ld['load_before']['loadavg']} -> "
        f"{ld['load_after']['loadavg']}; {ld['seconds']:.0f} s"
    )
    print(
        "cores: CPU s of the system's processes (client, workers, procs) / wall s of the "
        "workload; machine: busy cores of the whole machine meanwhile (max of the systems); "
        "ratio: danaus / monarch of the figures; cpu/op: of the CPU per operation"
    )
    print("\n".join(lines))
    failed = []
    for res in doc["runs"]:
        failed += [
            f"{res['system']}/{row['workload']}: {row['error'][:300]}"
            for row in res["rows"]
            if row.get("error")
        ]
        if res["note"]:
            failed.append(f"{res['system']}: {res['note'][:500]}")
    for res in doc["big"]:
        row = next((x for x in res["rows"] if x["workload"] == "correct"), None)
        ok = row is not None and not row.get("error")
        extra = (row or {}).get("extra", {})
        print(
            f"correctness {res['system']} {res['hosts']} hosts x {res['procs_per_host']} procs: "
            f"{'ok' if ok else 'FAILED'}"
            + (
                f", spawn {extra['spawn_s']:.2f} s, whole check {row['samples'][0]:.2f} s"
                if ok and row
                else ""
            )
            + f"; processes left after the workers stopped: "
            f"{res['left_in_cgroup_after_workers_stopped']}"
        )
        if not ok:
            failed.append(f"{res['system']} correctness: {(row or {}).get('error') or res['note']}")
    out = (
        Path(a.json)
        if a.json
        else (
            HERE
            / "results"
            / ("multihost-" + _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%SZ") + ".json")
        )
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1, default=str))
    print(f"json: {out}")
    if failed:
        print("failures:\n  " + "\n  ".join(failed))
        return 1
    if a.strict and any(c["ok"] is False for c in checks):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
