"""Prometheus metrics of the whole mesh: ``danaus.telemetry.serve_metrics`` and the
dashboard's ``/metrics``.

A scrape asks every proc of the client's tree for its statistics (one
``STATS`` round, as the dashboard does: ``state.discover``) and renders them
with ``prometheus_client`` in Prometheus's text format. Nothing is kept
between scrapes: counters are the procs' own (since each actor or proc
started), so a restarted actor's counters start again at 0, which Prometheus's
``rate()`` reads as a counter reset. ``prometheus_client`` is an optional
extra (``pip install 'danaus[prometheus]'``).

Series (labels ``mesh``, ``endpoint``, ``rank``; series of the same mesh name
on the same rank are summed, so two meshes spawned with one name show as one):

- ``danaus_endpoint_calls_total``, ``danaus_endpoint_errors_total``
- ``danaus_endpoint_latency_seconds`` (histogram; buckets at 2 per decade from
  1 µs to 100 s, read exactly from the procs' finer histograms)
- ``danaus_actor_queue_depth``, ``danaus_actor_received_messages_total`` (no ``endpoint``)
- ``danaus_proc_sent_bytes_total``, ``danaus_proc_received_bytes_total``
  (labels ``proc``, ``host``)
- ``danaus_procs`` (label ``state``: alive, lost, not_answering)
- ``danaus_supervisor_restarts_total`` (labels ``supervisor``, ``child``)
"""

from __future__ import annotations

import hmac
import http.server
import ipaddress
import logging
import threading
from collections.abc import Iterator
from typing import Any

from .._runtime.messaging.metrics import BOUNDS
from .._supervision.supervised import supervised
from .tables import gather

__all__ = ["MetricsServer", "exposition", "serve_metrics"]

log = logging.getLogger("danaus.telemetry")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_STEP = 4  # every 4th of the 8-per-decade bounds: 2 buckets per decade
_KEPT = list(range(0, len(BOUNDS), _STEP))


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

        snap = gather(rings=False)
        ep_labels = ["mesh", "endpoint", "rank"]
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

        eps: dict[tuple[str, str, str], list[Any]] = {}  # calls, errors, sum, buckets
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
            for a in s["actors"]:
                rank = str(a["rank"])
                acc = actors.setdefault((a["name"], rank), [0, 0])
                acc[0] += a["queued"]
                acc[1] += a["received"]
                for ep, raw in a["endpoints"].items():
                    cur = eps.setdefault((a["name"], ep, rank), [0, 0, 0.0, {}])
                    cur[0] += raw["calls"]
                    cur[1] += raw["errors"]
                    cur[2] += raw["total_s"]
                    for i, c in raw["buckets"].items():
                        cur[3][int(i)] = cur[3].get(int(i), 0) + c
        for key, (n, err, total, buckets) in sorted(eps.items()):
            labels = list(key)
            calls.add_metric(labels, n)
            errors.add_metric(labels, err)
            latency.add_metric(labels, _cumulative(buckets, n), sum_value=total)
        for (mesh, rank), (q, r) in sorted(actors.items()):
            queue.add_metric([mesh, rank], q)
            received.add_metric([mesh, rank], r)
        for state, n in states.items():
            procs.add_metric([state], n)
        reg = supervised()
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


def _cumulative(buckets: dict[int, int], total: int) -> list[tuple[str, float]]:
    """Prometheus's ``le`` buckets (cumulative) from the procs' sparse fine buckets."""
    out = []
    running = 0
    fine = sorted(buckets.items())
    j = 0
    for i in _KEPT:
        while j < len(fine) and fine[j][0] <= i:
            running += fine[j][1]
            j += 1
        out.append((f"{BOUNDS[i]:.6g}", float(running)))
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


class MetricsServer:
    """A running ``/metrics`` endpoint: ``url``, ``stop()``; a context manager."""

    def __init__(self, host: str, port: int, token: str | None) -> None:
        registry()  # fail now, in the caller, if prometheus_client is missing
        self.token = token
        handler = _handler(self)
        self._server = http.server.ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self.host = host
        self.port = int(self._server.server_address[1])
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{self.port}/metrics"
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="danaus-metrics", daemon=True
        )
        self._thread.start()

    def authorized(self, authorization: str) -> bool:
        if self.token is None:
            return True
        want = f"Bearer {self.token}"
        return hmac.compare_digest(authorization.encode(), want.encode())

    def stop(self) -> None:
        """Stop serving (idempotent)."""
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join()
        self._server.server_close()

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"MetricsServer({self.url!r})"


def _handler(server: MetricsServer) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        server_version = "danaus-metrics"

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("metrics: " + format, *args)

        def _send(self, code: int, body: bytes, ctype: str = "text/plain") -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            if code == 401:
                self.send_header("WWW-Authenticate", 'Bearer realm="danaus"')
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if not server.authorized(self.headers.get("Authorization", "")):
                self._send(401, b"unauthorized: send the bearer token\n")
                return
            if self.path.split("?", 1)[0] != "/metrics":
                self._send(404, b"not found: the metrics are at /metrics\n")
                return
            try:
                body = exposition()
            except Exception as e:  # say why rather than drop the connection
                log.exception("collecting the metrics failed")
                self._send(500, f"collecting the metrics failed: {e}\n".encode())
                return
            try:
                self._send(200, body, CONTENT_TYPE)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the scraper gave up waiting (its scrape_timeout)

    return Handler


def serve_metrics(
    port: int = 0, host: str = "127.0.0.1", token: str | None = None
) -> MetricsServer:
    """Serve the whole mesh's metrics at ``http://host:port/metrics`` for Prometheus.

    ``port`` 0 picks a free one (read ``.url``). Listens on the loopback interface
    unless ``host`` says otherwise. With ``token``, each scrape must send
    ``Authorization: Bearer TOKEN`` (Prometheus's ``authorization`` scrape
    setting); others get 401. Raises ``ImportError`` without prometheus_client,
    ``ValueError`` for a bad port, host or token.
    """
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"port must be an int in 0..65535, got {port!r}")
    if not isinstance(host, str) or not host:
        raise ValueError(f"host must be a non-empty str, got {host!r}")
    if token is not None and (not isinstance(token, str) or not token or "\n" in token):
        raise ValueError("token must be a non-empty str of one line (or None for no token)")
    try:
        if not ipaddress.ip_address(host).is_loopback:
            log.warning(
                "danaus metrics: serving on %s, reachable from other machines%s",
                host,
                "" if token else " without a token",
            )
    except ValueError:
        pass  # a host name: the caller chose it
    return MetricsServer(host, port, token)
