"""OpenTelemetry tracing set-up: an SDK tracer provider named after the service.

Spans are exported over OTLP when the standard variables ask for it
(``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``; protocol from
``OTEL_EXPORTER_OTLP_PROTOCOL``, ``http/protobuf`` by default, or ``grpc``; ``OTEL_TRACES_EXPORTER=none``
turns it off; batching from ``OTEL_BSP_*``), to stderr when ``TRAINYARD_TRACE_CONSOLE=1``, and
otherwise only used for context propagation (trace ids in logs and NATS headers).

Every span started under a TrainJob's context carries the ``trainjob.uid`` attribute: the uid
travels as W3C baggage (``trainjob.uid``) in the NATS headers next to ``traceparent``, and
:class:`TrainJobUidProcessor` copies it onto each span when it starts.
"""
from __future__ import annotations

import logging
import os
import random
from contextlib import contextmanager
from typing import Iterator, Sequence

from opentelemetry import baggage, context as otel_context, trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
from opentelemetry.trace import Link, SpanKind

log = logging.getLogger(__name__)

TRAINJOB_UID = "trainjob.uid"


class TrainJobUidProcessor(SpanProcessor):
    """Copies the ``trainjob.uid`` baggage entry of the parent context onto every new span."""

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        uid = baggage.get_baggage(TRAINJOB_UID, parent_context)
        if uid:
            span.set_attribute(TRAINJOB_UID, str(uid))

    def on_end(self, span: ReadableSpan) -> None:
        pass

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def _otlp_exporter():
    protocol = (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf")
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        return GrpcExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def otlp_requested() -> bool:
    exporters = {e.strip() for e in os.environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",")}
    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    return bool(endpoint) and "otlp" in exporters


def configure_tracing(service: str) -> TracerProvider:
    name = os.environ.get("OTEL_SERVICE_NAME") or f"trainyard-{service}"
    from trainyard.telemetry import detail

    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    provider.add_span_processor(TrainJobUidProcessor())
    # Planning-phase and API-write spans only when some exporter sees them (docs/performance.md).
    detail.set_enabled(otlp_requested() or os.environ.get("TRAINYARD_TRACE_CONSOLE") == "1")
    if otlp_requested():
        provider.add_span_processor(BatchSpanProcessor(_otlp_exporter()))
        log.info("exporting traces over OTLP", extra={
            "endpoint": os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")})
    if os.environ.get("TRAINYARD_TRACE_CONSOLE") == "1":
        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    trace.set_tracer_provider(provider)
    return provider


def with_trainjob(uid: str, ctx: Context | None = None) -> Context:
    """``ctx`` (the current context when None) with the TrainJob's uid as baggage."""
    return baggage.set_baggage(TRAINJOB_UID, uid, ctx)


@contextmanager
def context_span(tracer: trace.Tracer, name: str, *, kind: SpanKind = SpanKind.INTERNAL,
                 links: Sequence[Link] = (), attributes: dict | None = None) -> Iterator[trace.Span]:
    """The current span for the block, under the current context.

    When spans leave the process (an exporter is configured: ``detail.enabled()``), a real span.
    Otherwise spans only carry the trace context into logs and NATS headers, and a
    non-recording span with a fresh span id in the parent's trace (a new trace without one) does
    exactly that for a fraction of an SDK span's cost (attributes, processors, ending): the per
    message spans were a tenth of the status service's samples."""
    from trainyard.telemetry import detail

    if detail.enabled():
        with tracer.start_as_current_span(name, kind=kind, links=list(links), attributes=attributes or {}) as span:
            yield span
        return
    parent = trace.get_current_span().get_span_context()
    if parent.is_valid:
        context = trace.SpanContext(parent.trace_id, _random_bits(64), is_remote=False,
                                    trace_flags=parent.trace_flags, trace_state=parent.trace_state)
    else:
        context = trace.SpanContext(_random_bits(128), _random_bits(64), is_remote=False,
                                    trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED))
    span = trace.NonRecordingSpan(context)
    with trace.use_span(span, end_on_exit=False):
        yield span


def _random_bits(bits: int) -> int:
    """A non-zero random id of ``bits`` bits (as the SDK's id generator makes them)."""
    value = 0
    while value == 0:
        value = random.getrandbits(bits)
    return value


@contextmanager
def trainjob_span(tracer: trace.Tracer, name: str, uid: str | None, *, root: bool = False,
                  links: Sequence[Link] = (), kind: SpanKind = SpanKind.INTERNAL,
                  attributes: dict | None = None) -> Iterator[trace.Span]:
    """A span (a new trace when ``root``) in the TrainJob's context: it and every span below
    it, in this process and across the bus, carry ``trainjob.uid``."""
    base = Context() if root else None
    ctx = with_trainjob(uid, base) if uid else (base if base is not None else otel_context.get_current())
    token = otel_context.attach(ctx)
    try:
        with context_span(tracer, name, kind=kind, links=links, attributes=attributes) as span:
            yield span
    finally:
        otel_context.detach(token)


def current_traceparent() -> str:
    """The current span as a W3C ``traceparent`` value ("" when there is none)."""
    span = trace.get_current_span().get_span_context()
    if not span.is_valid:
        return ""
    return f"00-{span.trace_id:032x}-{span.span_id:016x}-{int(span.trace_flags):02x}"


def link_to(traceparent: str, uid: str | None = None) -> list[Link]:
    """A span link to the span a ``traceparent`` names (none when it is empty or malformed)."""
    parts = traceparent.split("-") if traceparent else []
    if len(parts) != 4:
        return []
    try:
        context = trace.SpanContext(int(parts[1], 16), int(parts[2], 16), is_remote=True,
                                    trace_flags=trace.TraceFlags(int(parts[3], 16)))
    except ValueError:
        return []
    if not context.is_valid:
        return []
    return [Link(context, {TRAINJOB_UID: uid} if uid else {})]
