"""Installing OpenTelemetry's SDK providers as the global ones, with the exporters the
standard ``OTEL_*`` variables name (``telemetry.enable`` does, unless the program set
its own), and the error that names the extra to install.
"""

from __future__ import annotations

import os
from typing import Any

from ..._runtime.node import this_node
from .span_export import Exports, Flusher

__all__ = ["EXTRA", "install_providers", "missing"]

#: How to install what telemetry needs, for error messages.
EXTRA = "pip install 'danaus[telemetry]'"


def missing(what: str) -> ImportError:
    """The error for using ``what`` without the telemetry extra."""
    return ImportError(
        f"{what} needs OpenTelemetry's API and SDK, which danaus does not install by "
        f"default: {EXTRA}"
    )


def _credential(name: str) -> bool:
    """Whether the ``OTEL_*`` variable ``name`` may carry a credential (the exporters'
    headers hold ``Authorization=...``): it never goes into a spawn frame."""
    return name.endswith("_HEADERS") or any(w in name for w in ("SECRET", "TOKEN", "PASSWORD"))


def _exporter_names(var: str, endpoint_vars: tuple[str, ...]) -> list[str]:
    raw = os.environ.get(var)
    if raw is None:  # the SDK's default is otlp: used when an endpoint says where
        return ["otlp"] if any(os.environ.get(v) for v in endpoint_vars) else []
    names = [n.strip().lower() for n in raw.split(",") if n.strip()]
    for n in names:
        if n not in ("otlp", "console", "none"):
            raise ValueError(
                f"{var}={raw!r}: danaus knows the exporters 'otlp', 'console' and 'none'"
            )
    return [n for n in names if n != "none"]


def _protocol(signal: str) -> str:
    proto = (
        os.environ.get(f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL")
        or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    )
    if proto not in ("http/protobuf", "grpc"):
        raise ValueError(
            f"OTEL_EXPORTER_OTLP_PROTOCOL={proto!r}: danaus exports over 'http/protobuf' "
            "(the default) or 'grpc'"
        )
    return proto


def _otlp(signal: str) -> Any:
    """The OTLP exporter class for ``signal`` (``TRACES``/``METRICS``), by protocol."""
    kind = "trace_exporter" if signal == "TRACES" else "metric_exporter"
    cls = "OTLPSpanExporter" if signal == "TRACES" else "OTLPMetricExporter"
    if _protocol(signal) == "grpc":
        module, package = f"opentelemetry.exporter.otlp.proto.grpc.{kind}", "grpc"
    else:
        module, package = f"opentelemetry.exporter.otlp.proto.http.{kind}", "http"
    try:
        mod = __import__(module, fromlist=[cls])
    except ImportError as e:
        raise ImportError(
            f"exporting over OTLP needs opentelemetry-exporter-otlp-proto-{package} "
            f"({EXTRA} brings the http one): {e}"
        ) from e
    return getattr(mod, cls)()


def install_providers(exports: Exports) -> None:
    """The SDK's tracer and meter providers, with the exporters of the ``OTEL_*``
    variables, as the global ones (each only if the program has not set its own)."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return
    from opentelemetry import metrics, trace

    try:
        from opentelemetry.sdk.resources import Resource
    except ImportError as e:
        raise missing("danaus telemetry") from e
    attrs: dict[str, Any] = {"process.pid": os.getpid()}
    if not os.environ.get("OTEL_SERVICE_NAME"):
        attrs["service.name"] = "danaus"
    node = this_node(start=False)
    if node is not None:
        attrs["danaus.proc"] = node.runtime.proc_id.name
    resource = Resource.create(attrs)
    endpoint = "OTEL_EXPORTER_OTLP_ENDPOINT"
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

        tp = TracerProvider(resource=resource)
        names = _exporter_names(
            "OTEL_TRACES_EXPORTER", (endpoint, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        )
        # First, so that at exit the endpoint spans go out before the exporters shut.
        flusher = Flusher(exports)
        tp.add_span_processor(flusher)  # type: ignore[arg-type]
        processors: set[Any] = {flusher}
        fast = []
        for n in names:
            exporter = _otlp("TRACES") if n == "otlp" else ConsoleSpanExporter()
            bsp = BatchSpanProcessor(exporter)
            tp.add_span_processor(bsp)
            processors.add(bsp)
            if n == "otlp" and _protocol("TRACES") == "http/protobuf":
                fast.append(_otlp("TRACES"))  # endpoint spans, encoded by span_export.Exports
            elif n == "otlp" or n == "console":
                fast = []
                processors.discard(bsp)  # needs SDK spans: endpoint spans go the SDK's way
        exports.ours.update(provider=tp, processors=processors, fast=fast)
        trace.set_tracer_provider(tp)
    if type(metrics.get_meter_provider()).__name__ == "_ProxyMeterProvider":
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import (
            ConsoleMetricExporter,
            PeriodicExportingMetricReader,
        )

        names = _exporter_names(
            "OTEL_METRICS_EXPORTER", (endpoint, "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
        )
        readers = [
            PeriodicExportingMetricReader(
                _otlp("METRICS") if n == "otlp" else ConsoleMetricExporter()
            )
            for n in names
        ]
        metrics.set_meter_provider(MeterProvider(resource=resource, metric_readers=readers))
