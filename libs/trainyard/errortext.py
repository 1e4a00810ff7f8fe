"""What failed, in words, for log lines and error messages.

Many exceptions print as an empty string (``asyncio.TimeoutError()``, nats-py's
``TimeoutError`` raised bare, a ``ConnectionResetError`` with no arguments), so a line written
as ``"fetch failed: %s" % err`` can end in nothing. :func:`describe` never returns an empty
string: the exception's text when it has one, else its type name, followed by what caused it.
"""
from __future__ import annotations

import asyncio

MAX_CAUSES = 3  # a chain deeper than this says nothing more to a reader of one log line


def describe(err: BaseException) -> str:
    """``err`` in one line that names what failed: its text, else its type name (with the
    exception it was raised from, when that has more to say)."""
    parts: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen and len(parts) < MAX_CAUSES:
        seen.add(id(current))
        text = " ".join(str(current).split())
        if text:
            parts.append(text)
            break  # a text that says something ends the line: the cause was already put into it
        parts.append(type(current).__name__)
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
        if isinstance(current, asyncio.CancelledError) and not str(current):
            break  # asyncio.wait_for's timeout comes from cancelling the wait: no news in that
    return " from ".join(parts)
