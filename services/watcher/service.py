"""watcher: list+watch of the trainer objects -> KV snapshots + events on JetStream.

Each observed change is first recorded in the snapshot bucket (so a consumer woken by the
event reads at least that version), then published with ``Nats-Msg-Id`` =
object/uid/resourceVersion: two watcher replicas publish the same ids, JetStream keeps one.
Events are queued and published in pipelined batches, in observation order.
"""
from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from typing import Any

from opentelemetry import context as otel_context, trace

from trainyard.bus.backlog import export_role_backlogs
from trainyard.bus.envelopes import EventType, ObjectEvent
from trainyard.bus.auth import from_environment as credentials_from_environment
from trainyard.bus.kv import SKIP, resource_version_newer
from trainyard.bus.publisher import Outgoing, last_published_ids
from trainyard.bus.redact import redact
from trainyard.bus.session import BusSession
from trainyard.bus.subjects import bus_kind, event_filter, partitions_setting
from trainyard.bus.topology import EVENTS_STREAM
from trainyard.errortext import describe
from trainyard.kube import resources as r
from trainyard.kube.client import KubeClient
from trainyard.kube.resources import Resource
from trainyard.kube.watch import list_and_watch
from trainyard.pipeline.plugins import CHILD_KINDS
from trainyard.pipeline.trainjobs import owned_by_trainjob, owner_reference
from trainyard.telemetry import metrics
from trainyard.telemetry.tracing import trainjob_span

log = logging.getLogger(__name__)
_tracer = trace.get_tracer("trainyard.watcher")

# The TrainJobs, their runtimes, what the plugins make for them (CHILD_KINDS) and the
# PriorityClasses planning reads.
WATCHED: tuple[Resource, ...] = tuple(dict.fromkeys((
    r.TRAINJOB, r.TRAINING_RUNTIME, r.CLUSTER_TRAINING_RUNTIME,
    *(r.resource_for(child.api_version, child.kind) for child in CHILD_KINDS), r.PRIORITY_CLASS,
)))
# Kinds that many other objects are too: they matter only when a TrainJob owns them.
OWNED_ONLY = (r.SECRET, r.CONFIGMAP, r.HORIZONTAL_POD_AUTOSCALER)
BATCH_MAX = 512
SCAN_TIMEOUT_S = 5.0  # reading the last event ids of one kind at a relist


def trainjob_uid_of(event: ObjectEvent) -> str | None:
    """The TrainJob an event belongs to: the TrainJob itself, or the owner of a child."""
    if event.kind == r.TRAINJOB.kind:
        return event.uid or None
    ref = owner_reference(event.object)
    return (ref.get("uid") or None) if ref is not None else None


def observation_context(event: ObjectEvent) -> Any:
    """Each observed change of a TrainJob (or of an object it owns) starts a trace: a short
    ``observe <Kind>`` span whose context the event is published under. None for others."""
    uid = trainjob_uid_of(event)
    if uid is None:
        return None
    meta = event.object.get("metadata") or {}
    with trainjob_span(_tracer, f"observe {event.kind}", uid, root=True, attributes={
        "k8s.kind": event.kind, "k8s.namespace.name": event.namespace, "k8s.object.name": event.name,
        "k8s.event.type": event.type, "k8s.resource_version": str(meta.get("resourceVersion", "")),
    }):
        return otel_context.get_current()


class EventSink:
    """Queues events and publishes them in batches (snapshot first, then the event)."""

    def __init__(self, bus: BusSession, cluster: str, queue_size: int = 4096) -> None:
        self._bus = bus
        self._cluster = cluster
        self._queue: asyncio.Queue[tuple[ObjectEvent, Any]] = asyncio.Queue(maxsize=queue_size)
        self._partitions = partitions_setting()

    async def put(self, event_type: EventType, obj: dict[str, Any]) -> None:
        # A Secret goes on the bus as a reference (keys and digest), never with its data.
        await self.put_event(ObjectEvent.from_object(self._cluster, event_type, redact(obj)))

    async def put_event(self, event: ObjectEvent) -> None:
        metrics.WATCH_EVENTS.labels(event.kind, event.type).inc()
        await self._queue.put((event, observation_context(event)))

    async def run(self, stop: asyncio.Event) -> None:
        while not (stop.is_set() and self._queue.empty()):
            try:
                first = await asyncio.wait_for(self._queue.get(), timeout=0.5)
            except asyncio.TimeoutError:
                continue
            batch = [first]
            while len(batch) < BATCH_MAX and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            await self._flush_until_done(batch, stop)
            # Not kept while waiting for the next event: up to BATCH_MAX whole objects.
            del batch, first

    async def _flush_until_done(self, batch: list[tuple[ObjectEvent, Any]], stop: asyncio.Event) -> None:
        attempt = 0
        while True:
            try:
                await self._flush(batch)
                return
            except Exception as err:  # NATS away: keep the batch, in order, and retry
                attempt += 1
                log.warning("publishing %d events failed (%s); retrying", len(batch), describe(err))
                if stop.is_set() and attempt > 20:
                    log.error("giving up on %d events at shutdown (a relist recovers them)", len(batch))
                    return
                await asyncio.sleep(min(0.2 * attempt, 2.0))

    async def _flush(self, batch: list[tuple[ObjectEvent, Any]]) -> None:
        by_key: OrderedDict[Any, list[ObjectEvent]] = OrderedDict()
        for event, _ in batch:
            by_key.setdefault(event.key, []).append(event)

        async def record(events: list[ObjectEvent]) -> None:
            for event in events:
                await self._bus.snapshots.record(event.key, event.object, deleted=event.type == "DELETED")

        await asyncio.gather(*(record(events) for events in by_key.values()))
        await self._bus.publisher.publish_many(
            Outgoing(e.subject(self._partitions), e, e.msg_id(), context) for e, context in batch
        )


class ResourceFeed:
    """The watch handler of one resource: turns list/watch results into sink events."""

    def __init__(self, bus: BusSession, sink: EventSink, cluster: str) -> None:
        self._bus = bus
        self._sink = sink
        self._cluster = cluster
        self.synced: set[str] = set()
        # A relist in progress, per resource: the last event id per subject and the names listed.
        self._relisting: dict[Resource, tuple[dict[str, str], set[tuple[str, str]]]] = {}
        # A secured bus grants the watcher no consumer of the events stream (docs/security.md):
        # there a relist publishes every object, as before.
        self._scan_refused = credentials_from_environment() is not None

    async def _published_ids(self, kind: str) -> dict[str, str]:
        """The last event id per subject of ``kind``; empty (publish everything, as a first
        start does) when the events stream cannot be read: a secured bus grants the watcher no
        consumers of it."""
        if self._scan_refused:
            return {}
        try:
            return await asyncio.wait_for(
                last_published_ids(self._bus.js, EVENTS_STREAM, event_filter(self._cluster, kind)), SCAN_TIMEOUT_S)
        except Exception as err:  # noqa: BLE001 - an optimisation only
            self._scan_refused = True
            log.info("cannot read the events stream (%r); a relist publishes every object", err)
            return {}

    def _wanted(self, resource: Resource, obj: dict[str, Any]) -> bool:
        return resource not in OWNED_ONLY or owned_by_trainjob(obj)

    async def on_event(self, resource: Resource, event_type: str, obj: dict[str, Any]) -> None:
        if event_type in ("ADDED", "MODIFIED", "DELETED") and self._wanted(resource, obj):
            await self._sink.put(event_type, obj)  # type: ignore[arg-type]

    async def on_relist(self, resource: Resource, items: list[dict[str, Any]], list_rv: str) -> None:
        """Publishes the listed state, and DELETED for stored objects no longer listed (the
        list in one piece; ``list_and_watch`` hands it over page by page)."""
        await self.on_relist_page(resource, items, True)
        await self.on_relist_end(resource, list_rv)

    async def on_relist_page(self, resource: Resource, items: list[dict[str, Any]], first: bool = False) -> None:
        """One page of a list. A listed object whose current state is already the last event
        on its subject (its snapshot was recorded before that event was published) is not
        published again: a restarted watcher then costs the consumers nothing for the thousands
        of objects that did not change while it was away, and an event that was lost (recorded,
        never published) is still published."""
        if first or resource not in self._relisting:
            self._relisting[resource] = (await self._published_ids(bus_kind(resource.api_version, resource.kind)), set())
        published, listed = self._relisting[resource]
        for obj in items:
            if not self._wanted(resource, obj):
                continue
            meta = obj.get("metadata") or {}
            listed.add((meta.get("namespace") or "", meta.get("name", "")))
            event = ObjectEvent.from_object(self._cluster, "ADDED", redact(obj))
            if published.get(event.subject()) == event.msg_id():
                continue
            await self._sink.put_event(event)

    async def on_relist_end(self, resource: Resource, list_rv: str) -> None:
        """The list is complete: DELETED for every stored live object it did not name."""
        if resource not in self._relisting:
            await self.on_relist_page(resource, [], True)
        _, listed = self._relisting.pop(resource)
        kind = bus_kind(resource.api_version, resource.kind)

        def unlisted(snapshot: Any) -> Any:
            """Only the live snapshots the list no longer has (whole objects of all of them
            would be the watcher's biggest allocation with thousands of objects)."""
            meta = snapshot.object.get("metadata") or {}
            if snapshot.deleted or (meta.get("namespace") or "", meta.get("name", "")) in listed:
                return SKIP
            return snapshot

        for snapshot in await self._bus.snapshots.list_snapshots(self._cluster, kind, keep=unlisted):
            # Written after our list by a faster replica? Then it is not a deletion.
            if list_rv and resource_version_newer(snapshot.resource_version, list_rv):
                continue
            await self._sink.put("DELETED", snapshot.object)
        self.synced.add(resource.plural + "." + resource.group)


async def run_watcher(bus: BusSession, kube: KubeClient, cluster: str, stop: asyncio.Event,
                      feed_ready: list[ResourceFeed] | None = None) -> None:
    sink = EventSink(bus, cluster)
    feed = ResourceFeed(bus, sink, cluster)
    if feed_ready is not None:
        feed_ready.append(feed)
    sink_task = asyncio.create_task(sink.run(stop))
    watches = [asyncio.create_task(list_and_watch(kube, resource, feed, stop)) for resource in WATCHED]
    # Each partitioned role's backlog, for autoscalers: the watcher runs whatever their counts.
    backlogs = asyncio.create_task(export_role_backlogs(bus.js, cluster, stop))
    await stop.wait()
    await asyncio.gather(*watches, backlogs, return_exceptions=True)
    await sink_task
