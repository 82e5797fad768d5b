"""OpenTelemetry set-up shared by the ingress and the engine replicas.

Each process calls `setup(cfg)` once; spans then go to the exporter the config
names: `console`, `otlp` (needs opentelemetry-exporter-otlp), `file` (one JSON
span per line, used by the tests), or `none`. The trace context crosses Ray
calls as a W3C `traceparent` dict inside the request.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Sequence

from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)

from common.config.runtime import TracingConfig

_lock = threading.Lock()
_configured = False


class JsonLinesSpanExporter(SpanExporter):
    """Appends each finished span as one compact JSON line to a file."""

    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = [json.dumps(json.loads(s.to_json())) + "\n" for s in spans]
        with _lock, open(self.path, "a") as fh:
            fh.writelines(lines)
        return SpanExportResult.SUCCESS


def _exporter(cfg: TracingConfig, base: Path) -> tuple[SpanExporter, bool] | None:
    if cfg.exporter == "console":
        return ConsoleSpanExporter(), False
    if cfg.exporter == "file":
        p = Path(cfg.file)
        return JsonLinesSpanExporter(p if p.is_absolute() else base / p), True
    if cfg.exporter == "otlp":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(endpoint=cfg.otlp_endpoint, insecure=True), False
    return None


def setup(cfg: TracingConfig, service: str, base: Path) -> None:
    """Installs the global tracer provider for this process (first call wins)."""
    global _configured
    with _lock:
        if _configured:
            return
        _configured = True
    made = _exporter(cfg, base)
    if made is None:
        return
    exporter, simple = made
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    processor = SimpleSpanProcessor(exporter) if simple else BatchSpanProcessor(exporter)
    provider.add_span_processor(processor)
    trace.set_tracer_provider(provider)


def tracer():
    return trace.get_tracer("baton")


def context_of(span):
    """An OTel context whose current span is `span`."""
    return trace.set_span_in_context(span)


def inject() -> dict[str, str]:
    """The current span's context as a carrier dict for a remote call."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


def extract(carrier: dict[str, str]):
    """An OTel context from a carrier made by `inject` in another process."""
    return propagate.extract(carrier)
