"""Each role's backlog on the bus, read from JetStream: one consumer listing per stream, summed
over the role's partitions' durables (``<role>-p<N>_<cluster>``, docs/bus.md).

Two processes need it: the dashboard (its backlog table) and the watcher, which exports it as
``trainyard_role_backlog_messages{role,cluster}`` for autoscalers (docs/deploy.md). The
consumers' own gauges (``trainyard_jetstream_consumer_*``) cannot serve a scaler: a role with
no replica running exports nothing, however long its backlog grows, while the watcher runs
at a fixed count and its listing sees every durable, read or not.

A listing is one request per 256 consumers of a stream (``$JS.API.CONSUMER.LIST.<stream>``,
paged), whatever the partition count: the watcher's grants allow exactly those listings of
the three streams (docs/security.md).
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from trainyard.bus.subjects import decode_token
from trainyard.bus.topology import EVENTS_STREAM, PLANS_STREAM, RESULTS_STREAM
from trainyard.errortext import describe
from trainyard.telemetry import metrics

log = logging.getLogger(__name__)

# The durable consumers whose backlog is read: (consumer role, stream). ``status-results`` is
# the status service's second consumer: its backlog is the status role's too.
CONSUMERS: tuple[tuple[str, str], ...] = (
    ("planner", EVENTS_STREAM), ("applier", PLANS_STREAM), ("status", EVENTS_STREAM),
    ("status-results", RESULTS_STREAM), ("dispatcher", EVENTS_STREAM),
)
SERVICE_OF: dict[str, str] = {"status-results": "status"}
# The partitioned roles (each scaled on its backlog). The dispatcher is the manager's and reads
# TrainJob events of every cluster of the bus, so every cluster's watcher reports it.
ROLES = ("planner", "applier", "status", "dispatcher")
BUS_WIDE_ROLES = frozenset({"dispatcher"})
LIST_PAGE = 256  # nats-server's page of a consumer listing (JSApiListLimit)
EXPORT_MIN_INTERVAL_S = 1.0  # scrapes closer together than this share one reading


@dataclass(frozen=True)
class ConsumerBacklog:
    """One consumer role's backlog on one cluster: its durables' figures added up."""

    consumer: str  # the consumer role: planner, applier, status, status-results, dispatcher
    cluster: str  # the cluster name (decoded from the durable's token)
    durables: int
    pending: int  # not yet delivered (num_pending)
    ack_pending: int  # delivered, not yet acknowledged (num_ack_pending)
    redelivered: int  # delivered more than once, not yet acknowledged (num_redelivered)

    @property
    def role(self) -> str:
        """The service whose replicas read these durables."""
        return SERVICE_OF.get(self.consumer, self.consumer)

    @property
    def messages(self) -> int:
        """The work left: pending plus ack-pending (what a stopped replica held comes back)."""
        return self.pending + self.ack_pending


def parse_durable(durable: str) -> tuple[str, str] | None:
    """(consumer role, cluster) of ``<role>_<cluster>`` or a partition's ``<role>-p<N>_<cluster>``;
    None for any other name (a short-lived consumer, a KV watcher)."""
    head, sep, tail = durable.partition("_")
    if not sep or not head or not tail:
        return None
    base, dash, number = head.rpartition("-p")
    role = base if dash and number.isdigit() else head
    try:
        return role, decode_token(tail)
    except ValueError:
        return None


async def list_consumers(js: Any, stream: str) -> list[Any]:
    """Every consumer of ``stream`` (nats-py's ``consumers_info`` returns one page)."""
    listed: list[Any] = []
    while True:
        page = await js.consumers_info(stream, offset=len(listed) or None)
        listed += page
        if len(page) < LIST_PAGE:
            return listed


async def read_backlogs(js: Any, consumers: tuple[tuple[str, str], ...] = CONSUMERS) -> list[ConsumerBacklog]:
    """Each consumer role's backlog on each cluster that has durables of it, in ``consumers``
    order, then by cluster. A stream that cannot be listed (not created yet, no answer) is left
    out: its roles have no figure, rather than a zero."""
    wanted = {role: stream for role, stream in consumers}
    listed: dict[str, list[Any]] = {}
    for stream in dict.fromkeys(wanted.values()):
        try:
            listed[stream] = await list_consumers(js, stream)
        except asyncio.CancelledError:
            raise
        except Exception as err:  # noqa: BLE001 - reported as no figure, tried again next time
            log.debug("cannot list the consumers of %s: %s", stream, describe(err))
    sums: dict[tuple[str, str], list[int]] = {}
    for stream, infos in listed.items():
        for info in infos:
            parsed = parse_durable(info.name or "")
            if parsed is None or wanted.get(parsed[0]) != stream:
                continue
            total = sums.setdefault(parsed, [0, 0, 0, 0])
            total[0] += 1
            total[1] += info.num_pending or 0
            total[2] += info.num_ack_pending or 0
            total[3] += info.num_redelivered or 0
    order = {role: index for index, (role, _) in enumerate(consumers)}
    return [ConsumerBacklog(role, cluster, *figures)
            for (role, cluster), figures in sorted(sums.items(), key=lambda item: (order[item[0][0]], item[0][1]))]


def role_backlogs(backlogs: list[ConsumerBacklog], cluster: str) -> dict[tuple[str, str], int]:
    """``(role, cluster) -> messages`` as the watcher of ``cluster`` exports them: its own
    cluster's partitioned roles (status with its results consumer), and the bus-wide roles (the
    dispatcher) of every cluster."""
    out: dict[tuple[str, str], int] = {}
    for backlog in backlogs:
        if backlog.role not in ROLES or (backlog.cluster != cluster and backlog.role not in BUS_WIDE_ROLES):
            continue
        key = (backlog.role, backlog.cluster)
        out[key] = out.get(key, 0) + backlog.messages
    return out


class RoleBacklogExport:
    """``trainyard_role_backlog_messages`` of ``cluster``, read when it is asked for (a scrape of
    ``/metrics``), at most once every ``min_interval_s``: scrapes that come together share one
    reading. A role whose figure cannot be read any more loses its series (an autoscaler then
    sees no value, and holds, instead of a stale one)."""

    def __init__(self, js: Any, cluster: str, min_interval_s: float = EXPORT_MIN_INTERVAL_S) -> None:
        self.js, self.cluster, self.min_interval_s = js, cluster, min_interval_s
        self._exported: set[tuple[str, str]] = set()
        self._read_at = float("-inf")  # monotonic time of the last reading
        self._lock = asyncio.Lock()  # scrapes that come together share one reading

    async def refresh(self) -> None:
        async with self._lock:
            if time.monotonic() - self._read_at >= self.min_interval_s:
                await self._read()

    async def _read(self) -> None:
        try:
            current = role_backlogs(await read_backlogs(self.js), self.cluster)
        except asyncio.CancelledError:
            raise
        except Exception as err:  # noqa: BLE001 - the watcher's main work goes on
            log.warning("role backlogs not read: %s", describe(err))
            current = {}
        self._read_at = time.monotonic()
        for key in self._exported - current.keys():
            metrics.ROLE_BACKLOG.remove(*key)
        for key, messages in current.items():
            metrics.ROLE_BACKLOG.labels(*key).set(messages)
        self._exported = set(current)


async def export_role_backlogs(js: Any, cluster: str, stop: asyncio.Event,
                               min_interval_s: float = EXPORT_MIN_INTERVAL_S) -> None:
    """Serves ``trainyard_role_backlog_messages`` on every scrape of this process's ``/metrics``
    until ``stop``: one listing per stream per scrape (at most one every ``min_interval_s``).
    An idle watcher that nobody scrapes lists nothing (it listed every 5 s: three replies of
    about 16 KB each to parse, most of an idle watcher's CPU)."""
    from trainyard.telemetry.scrape import on_scrape

    export = RoleBacklogExport(js, cluster, min_interval_s)
    remove = on_scrape(export.refresh)
    try:
        await stop.wait()
    finally:
        remove()
