"""W3C trace context carried in NATS headers (``traceparent``/``tracestate``)."""
from __future__ import annotations

from typing import Iterator, Mapping
from contextlib import contextmanager

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind

from trainyard.telemetry.tracing import context_span

_tracer = trace.get_tracer("trainyard.bus")


def inject_headers(headers: dict[str, str] | None = None) -> dict[str, str]:
    """Adds the current span's trace context to ``headers`` (a new dict when None)."""
    carrier: dict[str, str] = dict(headers or {})
    propagate.inject(carrier)
    return carrier


@contextmanager
def publish_span(subject: str, msg_id: str | None = None) -> Iterator[trace.Span]:
    with context_span(
        _tracer, f"publish {subject.split('.')[1] if '.' in subject else subject}",
        kind=SpanKind.PRODUCER,
        attributes={
            "messaging.system": "nats",
            "messaging.destination.name": subject,
            **({"messaging.message.id": msg_id} if msg_id else {}),
        },
    ) as span:
        yield span


@contextmanager
def consume_span(subject: str, headers: Mapping[str, str] | None, consumer: str) -> Iterator[trace.Span]:
    """A CONSUMER span whose parent is the publisher's span (extracted from headers)."""
    parent = propagate.extract(dict(headers or {}))
    token = otel_context.attach(parent)
    try:
        with context_span(
            _tracer, f"process {consumer}",
            kind=SpanKind.CONSUMER,
            attributes={
                "messaging.system": "nats",
                "messaging.destination.name": subject,
                "messaging.consumer.group.name": consumer,
            },
        ) as span:
            yield span
    finally:
        otel_context.detach(token)
