"""Structured JSON logging: one JSON object per line on stderr.

Fields: ``ts`` (RFC 3339 UTC), ``level``, ``service``, ``logger``, ``msg``, the current trace
and span ids when a span is active, plus anything passed with ``extra={...}``.
"""
from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

from opentelemetry import trace

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def __init__(self, service: str) -> None:
        super().__init__()
        self._service = service

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "service": self._service,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        span = trace.get_current_span().get_span_context()
        if span.is_valid:
            entry["trace_id"] = format(span.trace_id, "032x")
            entry["span_id"] = format(span.span_id, "016x")
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure_logging(service: str, level: str = "info") -> None:
    """Routes every logger through one JSON handler on stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(service))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Library chatter (connection retries, access logs) stays at warning unless asked for.
    for noisy in ("nats", "aiohttp.access", "uvicorn.access", "kubernetes_asyncio"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
