"""Figures read when ``/metrics`` is scraped, not on a timer.

A figure that costs a read to know (a role's backlog: a listing of JetStream consumers; the
TrainJob state gauge) registers a refresh here: a process that nobody scrapes does not read it
at all, and one scraped every 15 s reads it every 15 s. The health server runs the refreshes
before it answers ``/metrics``.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable

log = logging.getLogger(__name__)

Refresh = Callable[[], Awaitable[None]]
REFRESH_TIMEOUT_S = 5.0

_refreshes: list[Refresh] = []


def on_scrape(refresh: Refresh) -> Callable[[], None]:
    """Runs ``refresh`` before each ``/metrics`` answer (at most REFRESH_TIMEOUT_S; a failure is
    logged and the last figures are served). Returns the function that removes it again."""
    _refreshes.append(refresh)

    def remove() -> None:
        if refresh in _refreshes:
            _refreshes.remove(refresh)
    return remove


async def refresh_metrics() -> None:
    """Runs every :func:`on_scrape` refresh, concurrently."""
    results = await asyncio.gather(*(asyncio.wait_for(refresh(), REFRESH_TIMEOUT_S) for refresh in list(_refreshes)),
                                   return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            log.warning("a metric was not refreshed: %s", result or type(result).__name__)
