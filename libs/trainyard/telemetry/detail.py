"""Whether the fine-grained spans (planning phases and plugins, API-server writes) are made.

They are worth their cost only when spans leave the process: ``configure_tracing`` turns them
off when no exporter (OTLP or console) is configured. The span per handled message and per
publication is always made: it carries the trace context into logs and NATS headers.
Imports nothing, so pure planning code can ask.
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import Any, Callable

_enabled = True


def enabled() -> bool:
    return _enabled


def set_enabled(on: bool) -> None:
    global _enabled
    _enabled = on


def span(start: Callable[..., Any], name: str, **kwargs: Any) -> Any:
    """``start(name, **kwargs)`` (a tracer's ``start_as_current_span``) when detailed spans are
    on; otherwise a context that yields a span accepting attributes and recording nothing."""
    if _enabled:
        return start(name, **kwargs)
    from opentelemetry.trace import INVALID_SPAN

    return nullcontext(INVALID_SPAN)
