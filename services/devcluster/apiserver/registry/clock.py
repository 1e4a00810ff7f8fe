"""The server's clock as Kubernetes timestamps (RFC 3339, seconds, UTC)."""
from __future__ import annotations

import time
from datetime import datetime, timezone

_NOW_TEXT: tuple[int, str] = (-1, "")  # (epoch second, its RFC 3339 text): formatting costs per write


def now_rfc3339() -> str:
    global _NOW_TEXT
    second = int(time.time())
    if _NOW_TEXT[0] != second:
        _NOW_TEXT = (second, datetime.fromtimestamp(second, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))
    return _NOW_TEXT[1]


def rfc3339_in(seconds: int) -> str:
    """The time ``seconds`` from now (now for 0): a graceful deletion's deletionTimestamp."""
    if not seconds:
        return now_rfc3339()
    return datetime.fromtimestamp(int(time.time()) + seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
