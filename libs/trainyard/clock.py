"""Times as the Kubernetes API writes them: RFC 3339, UTC, whole seconds (``metav1.Time``).

One place for the format every service and library writes into conditions, Events and
timestamps, and for reading one back (the API server writes ``Z``; an offset is accepted).
"""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

RFC3339 = "%Y-%m-%dT%H:%M:%SZ"


def format_time(moment: datetime | str) -> str:
    """``moment`` as a ``metav1.Time`` string (a string is taken as already formatted)."""
    if isinstance(moment, str):
        return moment
    if moment.tzinfo is not None:
        moment = moment.astimezone(timezone.utc)
    return moment.strftime(RFC3339)


def now_rfc3339() -> str:
    """The current time as a ``metav1.Time`` string."""
    return format_time(datetime.now(timezone.utc))


def parse_time(value: Any) -> datetime | None:
    """An RFC 3339 timestamp (``Z`` or an offset; no zone means UTC), else None."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=timezone.utc)


def parse_epoch(value: Any) -> float | None:
    """:func:`parse_time` as seconds since the epoch, else None."""
    parsed = parse_time(value)
    return parsed.timestamp() if parsed is not None else None
