"""OpenTelemetry tracing set-up: an SDK tracer provider named after the service.

Spans are exported over OTLP when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set and an OTLP exporter
package is installed, to stderr when ``TRAINYARD_TRACE_CONSOLE=1``, and otherwise only used
for context propagation (trace ids in logs and NATS headers).
"""
from __future__ import annotations

import logging
import os

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

log = logging.getLogger(__name__)


def configure_tracing(service: str) -> TracerProvider:
    provider = TracerProvider(resource=Resource.create({"service.name": f"trainyard-{service}"}))
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            log.warning("OTEL_EXPORTER_OTLP_ENDPOINT set but no OTLP exporter package installed")
        else:
            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    if os.environ.get("TRAINYARD_TRACE_CONSOLE") == "1":
        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    trace.set_tracer_provider(provider)
    return provider
