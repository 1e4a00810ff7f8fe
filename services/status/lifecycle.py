"""Time-driven TrainJob transitions of the status service: ``activeDeadlineSeconds`` (v2.3.0)
and the opt-in TTL after finished.

Both are decided by pure functions of ``trainyard.pipeline.lifecycle``; this module only acts on
them (delete the JobSet of a TrainJob past its deadline, delete a TrainJob past its TTL) and
keeps one timer per TrainJob so that the next decision happens when it is due, not at the next
event. Timers are hints, like events: on start every TrainJob snapshot is looked at again.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Awaitable, Callable

from trainyard.kube import resources as r
from trainyard.kube.client import KubeClient
from trainyard.pipeline.lifecycle import active_deadline, finished_condition, ttl_expiry
from trainyard.pipeline.trainjobs import owned_by_uid
from trainyard.api import constants as c

log = logging.getLogger(__name__)

# A little late rather than early: a timer that fires before the deadline only re-arms itself.
_SLACK_S = 0.05


def deadline_failed(status: dict[str, Any]) -> bool:
    condition = finished_condition(status)
    return condition is not None and condition.get("type") == c.CONDITION_FAILED \
        and condition.get("reason") == c.REASON_DEADLINE_EXCEEDED


def next_due(trainjob: dict[str, Any], jobset: dict[str, Any] | None) -> datetime | None:
    """When this TrainJob needs another look: its deadline, or its TTL expiry."""
    moments = [m for m in (active_deadline(trainjob, jobset), ttl_expiry(trainjob)) if m is not None]
    return min(moments) if moments else None


@dataclass
class Lifecycle:
    kube: KubeClient
    recheck: Callable[[str, str], Awaitable[None]]
    _timers: dict[tuple[str, str], tuple[datetime, asyncio.TimerHandle]] = field(default_factory=dict)
    _tasks: set[asyncio.Task] = field(default_factory=set)

    async def after_fold(self, trainjob: dict[str, Any], jobset: dict[str, Any] | None) -> None:
        """``trainjob`` carries the status just written (or found unchanged)."""
        meta = trainjob["metadata"]
        namespace, name, uid = meta.get("namespace") or "", meta["name"], meta.get("uid")
        status = trainjob.get("status") or {}
        if deadline_failed(status) and owned_by_uid(jobset, uid):
            # As upstream: the JobSet of a TrainJob past its deadline is deleted (its pods stop).
            await self.kube.delete(r.JOBSET, namespace, name)
            log.info("deadline exceeded: JobSet deleted", extra={"trainjob": f"{namespace}/{name}"})
        expiry = ttl_expiry(trainjob)
        now = datetime.now(timezone.utc)
        if expiry is not None and expiry <= now:
            self.cancel(namespace, name)
            if await self.kube.delete(r.TRAINJOB, namespace, name, uid=uid):
                log.info("TTL after finished: TrainJob deleted", extra={"trainjob": f"{namespace}/{name}"})
            return
        due = next_due(trainjob, jobset)
        if due is None:
            self.cancel(namespace, name)
        else:
            self.schedule(namespace, name, due)

    def schedule(self, namespace: str, name: str, due: datetime) -> None:
        key = (namespace, name)
        current = self._timers.get(key)
        if current is not None and current[0] == due:
            return
        self.cancel(namespace, name)
        loop = asyncio.get_running_loop()
        delay = max(0.0, (due - datetime.now(timezone.utc)).total_seconds()) + _SLACK_S
        self._timers[key] = (due, loop.call_later(delay, self._fire, namespace, name))

    def cancel(self, namespace: str, name: str) -> None:
        current = self._timers.pop((namespace, name), None)
        if current is not None:
            current[1].cancel()

    def _fire(self, namespace: str, name: str) -> None:
        self._timers.pop((namespace, name), None)
        task = asyncio.get_running_loop().create_task(self._recheck(namespace, name))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _recheck(self, namespace: str, name: str) -> None:
        try:
            await self.recheck(namespace, name)
        except Exception:  # noqa: BLE001 - a timer must not die silently; the next event retries
            log.exception("timed TrainJob check failed", extra={"trainjob": f"{namespace}/{name}"})

    def close(self) -> None:
        for _, handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        for task in self._tasks:
            task.cancel()
