"""TrainJob lifecycle metrics: how many TrainJobs are in each state, and how long they take.

``trainyard_trainjobs{state,runtime}`` is recounted from the snapshot bucket every few seconds
(level-triggered: right whatever the number of status replicas; dashboards take ``max`` over
replicas). The two histograms are observed by the status write that makes the transition:
``time_to_running`` when the JobSet first reports active pods, ``time_to_complete`` when the
``Complete`` or ``Failed`` condition appears.
"""
from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from typing import Any, Awaitable, Callable

from trainyard.clock import parse_epoch
from trainyard.errortext import describe
from trainyard.pipeline.trainjobs import state_of
from trainyard.telemetry import metrics

log = logging.getLogger(__name__)


def _true(status: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in status.get("conditions") or []
                 if c.get("type") == kind and c.get("status") == "True"), None)


def runtime_name(trainjob: dict[str, Any]) -> str:
    return str(((trainjob.get("spec") or {}).get("runtimeRef") or {}).get("name") or "")




def observe_transition(trainjob: dict[str, Any], before: dict[str, Any], after: dict[str, Any],
                       now: float | None = None) -> None:
    """Called after a status write: observes the histograms for the transition it made."""
    created = parse_epoch((trainjob.get("metadata") or {}).get("creationTimestamp"))
    if created is None:
        return
    now = now if now is not None else dt.datetime.now(dt.timezone.utc).timestamp()
    runtime = runtime_name(trainjob)
    metrics.init_runtime_series(runtime)
    old, new = state_of(before), state_of(after)
    if new == old:
        return
    if new == "Running" and old in ("Pending", "Suspended"):
        metrics.TRAINJOB_TIME_TO_RUNNING.labels(runtime).observe(max(now - created, 0.0))
    if new in ("Complete", "Failed"):
        condition = _true(after, new) or {}
        finished = parse_epoch(condition.get("lastTransitionTime")) or now
        metrics.TRAINJOB_TIME_TO_COMPLETE.labels(runtime, new).observe(max(finished - created, 0.0))


def gauge_fields(trainjob: dict[str, Any]) -> dict[str, Any]:
    """The part of a TrainJob ``count_states`` reads."""
    return {"status": trainjob.get("status"), "spec": {"runtimeRef": (trainjob.get("spec") or {}).get("runtimeRef")}}


def count_states(trainjobs: list[dict[str, Any]]) -> dict[tuple[str, str], int]:
    counts: dict[tuple[str, str], int] = {}
    for job in trainjobs:
        key = (state_of(job.get("status")), runtime_name(job))
        counts[key] = counts.get(key, 0) + 1
    return counts


Lister = Callable[[], Awaitable[list[dict[str, Any]]]]


class StateGauge:
    """``trainyard_trainjobs``, recounted when ``/metrics`` is scraped (at most every
    ``min_interval_s``, and at least 20 times as long as the last recount took, so counting
    10,000 TrainJobs stays under 5 % of a core). Every runtime (``list_runtimes``) has its series
    from the start, at zero, so rates and increases count its first TrainJobs.

    ``counting``: whether this replica is the one that counts (a recount reads every TrainJob's
    snapshot, so N replicas each recounting cost N times the work for one figure); the others
    hold every series at zero, so that ``max`` and ``sum`` over replicas both give the count.

    ``version``: what the listings are read from, as a value that changes with any change (the
    snapshot bucket's last sequence); while it is unchanged the recount is skipped (an idle
    stack's status replica listed every TrainJob and runtime every 5 s to find the same counts)."""

    def __init__(self, list_trainjobs: Lister, min_interval_s: float = 1.0, list_runtimes: Lister | None = None,
                 counting: Callable[[], bool] | None = None, version: Callable[[], Awaitable[Any]] | None = None) -> None:
        self.list_trainjobs, self.list_runtimes = list_trainjobs, list_runtimes
        self.min_interval_s, self.counting, self.version = min_interval_s, counting, version
        self.runtimes: set[str] = set()
        self.counted_at: Any = None  # the version the figures were counted at (None: not counted)
        self._next = float("-inf")  # monotonic time before which no recount starts
        self._lock = asyncio.Lock()

    async def refresh(self) -> None:
        async with self._lock:  # scrapes that come together share one recount
            if self.counting is not None and not self.counting():
                self.counted_at = None
                for runtime in self.runtimes:
                    for state in metrics.TRAINJOB_STATES:
                        metrics.TRAINJOBS.labels(state, runtime).set(0)
                return
            started = time.monotonic()
            if started < self._next:
                return
            try:
                now_at = await self.version() if self.version is not None else None
                if now_at is not None and now_at == self.counted_at:
                    return
                counts = count_states(await self.list_trainjobs())
                known = [str((r.get("metadata") or {}).get("name") or "") for r in
                         (await self.list_runtimes() if self.list_runtimes is not None else [])]
            except asyncio.CancelledError:
                raise
            except Exception as err:  # NATS away: keep the last figures
                log.debug("counting TrainJobs failed: %s", describe(err))
                return
            self.counted_at = now_at
            for runtime in [runtime for _, runtime in counts] + known:
                if runtime not in self.runtimes:
                    self.runtimes.add(runtime)
                    metrics.init_runtime_series(runtime)
            for runtime in self.runtimes:
                for state in metrics.TRAINJOB_STATES:
                    metrics.TRAINJOBS.labels(state, runtime).set(counts.get((state, runtime), 0))
            self._next = started + max(self.min_interval_s, 20 * (time.monotonic() - started))


async def keep_state_gauge(list_trainjobs: Lister, stop: asyncio.Event, min_interval_s: float = 1.0,
                           list_runtimes: Lister | None = None, counting: Callable[[], bool] | None = None,
                           version: Callable[[], Awaitable[Any]] | None = None) -> None:
    """Serves ``trainyard_trainjobs`` (:class:`StateGauge`) on every scrape of this process's
    ``/metrics`` until ``stop``: nothing is read while nobody scrapes."""
    from trainyard.telemetry.scrape import on_scrape

    gauge = StateGauge(list_trainjobs, min_interval_s, list_runtimes, counting, version)
    remove = on_scrape(gauge.refresh)
    try:
        await stop.wait()
    finally:
        remove()
