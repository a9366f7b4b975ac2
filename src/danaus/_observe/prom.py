"""Prometheus metrics of the whole mesh: ``danaus.telemetry.serve_metrics`` and the
dashboard's ``/metrics``.

A scrape asks every proc of the client's tree for its statistics (one
``STATS`` round, as the dashboard does: ``state.discover``) and renders them
with ``prometheus_client`` in Prometheus's text format. The HTTP endpoints
(``serve_metrics``, the dashboard's ``/metrics``) keep the last rendering for
``metrics_min_interval`` and share one collection among concurrent scrapes;
nothing else is kept between scrapes: counters are the procs' own (since each actor or proc
started), so a restarted actor's counters start again at 0, which Prometheus's
``rate()`` reads as a counter reset. ``prometheus_client`` is an optional
extra (``pip install 'danaus[prometheus]'``).

Series (labels ``mesh``, ``class`` (the actor's class), ``proc_mesh`` (the
proc mesh's name as spawned, else the first actor mesh's spawned on it),
``endpoint``, ``rank``; series with the same labels are summed, so two meshes
spawned with one name show as one). At most ``metrics_max_series`` endpoint
label sets are exported: beyond it further ones are dropped (counted in
``danaus_metrics_dropped_series``) and one warning is logged:

- ``danaus_endpoint_calls_total``, ``danaus_endpoint_errors_total``
- ``danaus_endpoint_latency_seconds`` (histogram; the procs' own 216 buckets, each
  2^(1/8) (about 9 %) wider than the one before, from 1 µs to 113 s, so a
  quantile ``histogram_quantile`` reads from them is within 10 %, whatever the
  latencies; each label set is 219 series with its sum and count)
- ``danaus_metrics_dropped_series`` (gauge: endpoint label sets left out at this scrape)
- ``danaus_actor_queue_depth``, ``danaus_actor_received_messages_total`` (no ``endpoint``)
- ``danaus_proc_sent_bytes_total``, ``danaus_proc_received_bytes_total``
  (labels ``proc``, ``host``)
- ``danaus_proc_transfers_total``, ``danaus_proc_transfer_bytes_total``,
  ``danaus_proc_transfer_seconds_total``, ``danaus_proc_transfer_errors_total``
  (labels ``proc``, ``host``: data-plane transfers the proc started; 0 where none ran)
- ``danaus_gpu_memory_allocated_bytes``, ``danaus_gpu_memory_reserved_bytes``,
  ``danaus_gpu_memory_peak_bytes`` (gauges), ``danaus_gpu_kernels_total``,
  ``danaus_gpu_kernel_seconds_total``, ``danaus_gpu_copies_total``,
  ``danaus_gpu_copy_seconds_total`` (labels ``proc``, ``host``, ``device``; no series
  where no proc used a GPU)
- ``danaus_procs`` (label ``state``: alive, lost, not_answering)
- ``danaus_supervisor_restarts_total`` (labels ``supervisor``, ``child``)
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .. import _config as config
from .._runtime.messaging.metrics import BOUNDS
from .._runtime.node import this_node
from .._supervision.supervised import Supervised
from . import web as _web
from .tables import gather, gpu_of
from .web import SECURITY_HEADERS, HttpServer, Served, aiohttp_web, blocking, url_host

__all__ = ["MetricsServer", "cached_exposition", "exposition", "serve_metrics"]

log = logging.getLogger("danaus.telemetry")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LE = [f"{b:.6g}" for b in BOUNDS]  # the ``le`` labels, formatted once
_warned_series = False  # whether the metrics_max_series warning was logged (once a process)


def _client() -> Any:
    try:
        import prometheus_client
    except ImportError:
        raise ImportError(
            "Prometheus metrics need prometheus_client: pip install 'danaus[prometheus]'"
        ) from None
    return prometheus_client


class _MeshCollector:
    """A ``prometheus_client`` collector that asks the mesh at each scrape."""

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        # The process's registry serves whichever client session is current: a scrape (on
        # the metrics server's thread) holds no node, so this is a public face's lookup.
        node = this_node()
        snap = gather(node, rings=False)
        ep_labels = ["mesh", "class", "proc_mesh", "endpoint", "rank"]
        calls = CounterMetricFamily(
            "danaus_endpoint_calls", "Calls an endpoint handled.", labels=ep_labels
        )
        errors = CounterMetricFamily(
            "danaus_endpoint_errors", "Calls an endpoint raised on.", labels=ep_labels
        )
        latency = HistogramMetricFamily(
            "danaus_endpoint_latency_seconds",
            "Seconds an endpoint ran per call.",
            labels=ep_labels,
            unit="seconds",
        )
        queue = GaugeMetricFamily(
            "danaus_actor_queue_depth",
            "Calls waiting in an actor's inbox.",
            labels=["mesh", "rank"],
        )
        received = CounterMetricFamily(
            "danaus_actor_received_messages",
            "Messages delivered to an actor.",
            labels=["mesh", "rank"],
        )
        sent_b = CounterMetricFamily(
            "danaus_proc_sent_bytes", "Bytes a proc sent.", labels=["proc", "host"], unit="bytes"
        )
        recv_b = CounterMetricFamily(
            "danaus_proc_received_bytes",
            "Bytes a proc received.",
            labels=["proc", "host"],
            unit="bytes",
        )
        procs = GaugeMetricFamily(
            "danaus_procs", "Procs of this client by state.", labels=["state"]
        )
        restarts = CounterMetricFamily(
            "danaus_supervisor_restarts",
            "Restarts a supervisor made (danaus.supervisor).",
            labels=["supervisor", "child"],
        )

        proc_labels = ["proc", "host"]
        moved = [
            CounterMetricFamily(
                "danaus_proc_transfers", "Data-plane transfers a proc started.", labels=proc_labels
            ),
            CounterMetricFamily(
                "danaus_proc_transfer_bytes",
                "Bytes of the data-plane transfers a proc started.",
                labels=proc_labels,
                unit="bytes",
            ),
            CounterMetricFamily(
                "danaus_proc_transfer_seconds",
                "Seconds the data-plane transfers a proc started took, summed.",
                labels=proc_labels,
                unit="seconds",
            ),
            CounterMetricFamily(
                "danaus_proc_transfer_errors",
                "Data-plane transfers a proc started that failed.",
                labels=proc_labels,
            ),
        ]
        gpu_labels = ["proc", "host", "device"]
        gpus: list[tuple[str, Any]] = [
            (
                "allocated",
                GaugeMetricFamily(
                    "danaus_gpu_memory_allocated_bytes",
                    "Bytes of tensors a proc holds on a GPU.",
                    labels=gpu_labels,
                ),
            ),
            (
                "reserved",
                GaugeMetricFamily(
                    "danaus_gpu_memory_reserved_bytes",
                    "Bytes PyTorch's caching allocator of a proc holds on a GPU.",
                    labels=gpu_labels,
                ),
            ),
            (
                "peak",
                GaugeMetricFamily(
                    "danaus_gpu_memory_peak_bytes",
                    "The most bytes of tensors a proc held on a GPU at once.",
                    labels=gpu_labels,
                ),
            ),
            (
                "kernels",
                CounterMetricFamily(
                    "danaus_gpu_kernels", "Tensor engine ops timed as kernels.", labels=gpu_labels
                ),
            ),
            (
                "kernel_s",
                CounterMetricFamily(
                    "danaus_gpu_kernel_seconds",
                    "GPU seconds of the tensor engine's kernels (CUDA events).",
                    labels=gpu_labels,
                    unit="seconds",
                ),
            ),
            (
                "copies",
                CounterMetricFamily(
                    "danaus_gpu_copies", "Tensor engine ops timed as copies.", labels=gpu_labels
                ),
            ),
            (
                "copy_s",
                CounterMetricFamily(
                    "danaus_gpu_copy_seconds",
                    "GPU seconds of the tensor engine's copies (CUDA events).",
                    labels=gpu_labels,
                    unit="seconds",
                ),
            ),
        ]

        dropped = GaugeMetricFamily(
            "danaus_metrics_dropped_series",
            "Endpoint label sets left out of this scrape (metrics_max_series).",
        )

        eps: dict[tuple[str, ...], list[Any]] = {}  # calls, errors, sum, buckets
        cap = config.get("metrics_max_series")
        left_out: set[tuple[str, ...]] = set()
        actors: dict[tuple[str, str], list[int]] = {}
        states = {"alive": 0, "lost": 0, "not_answering": 0}
        for e in snap.entries:
            ok, s = e["answer"]
            if not ok:
                states["lost" if e["lost"] is not None else "not_answering"] += 1
                continue
            if not s["client"]:
                states["alive"] += 1
            sent = sum(c["bytes_sent"] for c in s["connections"])
            recv = sum(c["bytes_recv"] for c in s["connections"])
            sent_b.add_metric([s["proc"], s["host"] or ""], sent)
            recv_b.add_metric([s["proc"], s["host"] or ""], recv)
            g = gpu_of(s)
            if g["transfers"]:
                t = g["transfers"]
                for tfam, tkey in zip(moved, ("count", "bytes", "seconds", "errors"), strict=True):
                    tfam.add_metric([s["proc"], s["host"] or ""], t[tkey])
            for d in g["devices"]:
                for gkey, gfam in gpus:
                    gfam.add_metric([s["proc"], s["host"] or "", d["device"]], d[gkey])
            proc_mesh = e.get("proc_mesh") or ""
            for a in s["actors"]:
                rank = str(a["rank"])
                acc = actors.setdefault((a["name"], rank), [0, 0])
                acc[0] += a["queued"]
                acc[1] += a["received"]
                for ep, raw in a["endpoints"].items():
                    key = (a["name"], a.get("class") or "", proc_mesh, ep, rank)
                    cur = eps.get(key)
                    if cur is None:
                        if cap and len(eps) >= cap:
                            left_out.add(key)
                            continue
                        cur = eps[key] = [0, 0, 0.0, {}]
                    cur[0] += raw["calls"]
                    cur[1] += raw["errors"]
                    cur[2] += raw["total_s"]
                    for i, c in raw["buckets"].items():
                        cur[3][int(i)] = cur[3].get(int(i), 0) + c
        for ep_key, (n, err, total, buckets) in sorted(eps.items()):
            labels = list(ep_key)
            calls.add_metric(labels, n)
            errors.add_metric(labels, err)
            latency.add_metric(labels, _cumulative(buckets, n), sum_value=total)
        dropped.add_metric([], len(left_out))
        if left_out:
            _series_capped(cap, len(left_out))
        for (mesh, rank), (q, r) in sorted(actors.items()):
            queue.add_metric([mesh, rank], q)
            received.add_metric([mesh, rank], r)
        for state, n in states.items():
            procs.add_metric([state], n)
        reg = node.part(Supervised)
        with reg.lock:
            sups = list(reg.supervisors)
        per: dict[tuple[str, str], int] = {}
        for sup in sups:
            d = sup.describe()
            for r in d["restarts"]:
                k = (str(d["name"]), str(r["child"]))
                per[k] = per.get(k, 0) + 1
            for child in d["children"]:
                per.setdefault((str(d["name"]), str(child)), 0)
        for (sup_name, child), n in sorted(per.items()):
            restarts.add_metric([sup_name, child], n)
        yield from (calls, errors, latency, queue, received, sent_b, recv_b, procs, restarts)
        yield from moved
        yield from (fam for _, fam in gpus)
        yield dropped


def _series_capped(cap: int, n: int) -> None:
    """Say once a process that ``metrics_max_series`` was reached."""
    global _warned_series
    if not _warned_series:
        _warned_series = True
        log.warning(
            "Prometheus metrics reached metrics_max_series=%d endpoint label sets; %d more "
            "are dropped (danaus_metrics_dropped_series counts them; raise the setting "
            "to keep them)",
            cap,
            n,
        )


def _cumulative(buckets: dict[int, int], total: int) -> list[tuple[str, float]]:
    """Prometheus's ``le`` buckets (cumulative), one per bound, from the procs' sparse ones."""
    out = []
    running = 0
    fine = sorted(buckets.items())
    j = 0
    for i, le in enumerate(_LE):
        while j < len(fine) and fine[j][0] <= i:
            running += fine[j][1]
            j += 1
        out.append((le, float(running)))
    out.append(("+Inf", float(total)))
    return out


# A cache, per process: the registry holds one collector that reads the current
# session's meshes at each scrape, so it keeps no state of a session. _LOCK guards making it.
_REGISTRY: Any = None
_LOCK = threading.Lock()


def registry() -> Any:
    """The registry every exposition of this client reads (one mesh collector)."""
    global _REGISTRY
    prometheus_client = _client()
    with _LOCK:
        if _REGISTRY is None:
            reg = prometheus_client.CollectorRegistry(auto_describe=False)
            reg.register(_MeshCollector())
            _REGISTRY = reg
        return _REGISTRY


def exposition() -> bytes:
    """The mesh's metrics now, in Prometheus's text format."""
    prometheus_client = _client()
    return bytes(prometheus_client.generate_latest(registry()))


async def cached_exposition() -> bytes:
    """On the HTTP loop: the exposition, collected at most once per ``metrics_min_interval``.

    Scrapes that come while a collection runs wait for it rather than start their
    own, and those within ``metrics_min_interval`` of the last one get it again: the
    procs are asked at most once per interval whatever the number of scrapers
    (issue 40, N2: a scrape loop took 88% of a core).
    """
    cache = _cache()
    now = time.monotonic()
    if cache.body is not None and now - cache.at < config.get("metrics_min_interval"):
        return cache.body
    if cache.running is None or cache.running.done():
        registry()  # ImportError now, in this scrape, if prometheus_client is missing
        cache.running = asyncio.ensure_future(_collect(cache))
    return await asyncio.shield(cache.running)


async def _collect(cache: _Cache) -> bytes:
    body = await blocking(exposition)
    cache.body, cache.at = body, time.monotonic()
    return body


@dataclass
class _Cache:
    """The last exposition and the collection running now (touched on the HTTP loop only)."""

    body: bytes | None = None
    at: float = 0.0
    running: asyncio.Future[bytes] | None = None


_CACHE = _Cache()  # per process, as _REGISTRY


def _cache() -> _Cache:
    return _CACHE


class MetricsServer(Served):
    """A running ``/metrics`` endpoint: ``url``, ``token``, ``stop()``; a context manager."""

    def __init__(self, host: str, port: int, token: str) -> None:
        registry()  # fail now, in the caller, if prometheus_client is missing
        self.token = token
        self._server = HttpServer(host, port, token, {"/metrics": _metrics}, name="metrics")
        self.host = host
        self.port = int(self._server.address[1])
        self.url = f"http://{url_host(host)}:{self.port}/metrics"

    def stop(self) -> None:
        """Stop serving and close every connection (idempotent; blocks briefly)."""
        self._server.stop()

    def __repr__(self) -> str:
        return f"MetricsServer({self.url!r})"


async def _metrics(request: Any) -> Any:
    web = aiohttp_web()
    body = await cached_exposition()
    return web.Response(
        status=200, body=body, headers={**SECURITY_HEADERS, "Content-Type": CONTENT_TYPE}
    )


def serve_metrics(
    port: int = 0, host: str = "127.0.0.1", token: str | None = None
) -> MetricsServer:
    """Serve the whole mesh's metrics at ``http://host:port/metrics`` for Prometheus.

    ``port`` 0 picks a free one (read ``.url``). Listens on the loopback interface
    unless ``host`` says otherwise. Every scrape must send ``Authorization: Bearer
    TOKEN`` (Prometheus's ``authorization`` scrape setting; ``?token=TOKEN`` works
    too); others get 403 and are closed. Without ``token`` one is made
    and printed once to stderr with the URL (``.token`` holds it); another host's
    address (anything but loopback) needs a ``token`` of the caller's, since the one
    made here is only printed on this machine. Connections are bounded and idle ones
    closed as the dashboard's (``dashboard_max_connections``,
    ``dashboard_request_timeout``), and the procs are asked at most once per
    ``metrics_min_interval`` however often it is scraped. Does not block. Raises
    ``ImportError`` without prometheus_client or aiohttp, ``ValueError`` for a bad
    port, host or token or for another host's address without a token, ``OSError``
    if the address cannot be bound. Example:

        server = danaus.telemetry.serve_metrics(port=9464, token=open("tok").read())
    """
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"port must be an int in 0..65535, got {port!r}")
    if not isinstance(host, str) or not host:
        raise ValueError(f"host must be a non-empty str, got {host!r}")
    if token is not None and (
        not isinstance(token, str) or not token.strip() or "\n" in token or token != token.strip()
    ):
        raise ValueError(
            "token must be a non-empty str of one line without surrounding spaces "
            "(or None: one is made and printed)"
        )
    if token is None and not _loopback(host):
        raise ValueError(
            f"refusing to serve metrics on {host!r} without a token: that address is "
            "reachable from other machines. Pass token=... (and give Prometheus the same "
            "as its authorization credentials), or serve on 127.0.0.1"
        )
    made = token is None
    server = MetricsServer(host, port, token or secrets.token_urlsafe(24))
    if made:
        print(
            f"danaus metrics: {server.url} (Authorization: Bearer {server.token})",
            file=sys.stderr,
            flush=True,
        )
    return server


def _loopback(host: str) -> bool:
    """Whether every address ``host`` names is a loopback one (127.0.0.0/8, ::1)."""
    addrs = _web.bind_addresses(host)
    return addrs is not None and all(a.is_loopback for a in addrs)
