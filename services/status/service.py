"""status: folds JobSet status and plan/apply outcomes into TrainJob.status.

Triggered by TrainJob and JobSet events and by apply results; recomputes from the KV
snapshots with the pipeline's ``compute_trainjob_status`` (spec §5.2 steps 3-6) and writes the
status subresource only when it changed. Events are recorded after a successful write, for the
condition transitions it made. It also looks after the runtimes' ``resource-in-use`` finalizer,
since it sees every TrainJob and runtime event: v2.3.0 removes it wherever it is (the runtime
snapshot keeps TrainJobs independent of their runtime), v2.1.0 (``--trainer-compat v2.1``) keeps
it on runtimes TrainJobs reference (spec §2.4).
"""
from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import trace

from trainyard.bus.consumer import Delivery, decoding
from trainyard.bus.envelopes import ApplyResult, ObjectEvent
from trainyard.bus.kv import applied_key
from trainyard.bus.session import BusSession
from trainyard.bus.partitions import PartitionedSubscriber, Subscription
from trainyard.bus.subjects import (RESULTS_PREFIX, ObjectKey, event_filter, partition_filter, partitions_setting,
                                    trainjob_partition)
from trainyard.bus.topology import EVENTS_STREAM, RESULTS_STREAM, partition_durable
from trainyard.compat import DEFAULT_COMPAT, TrainerCompat
from trainyard.kube import resources as r
from trainyard.kube.client import KubeClient, KubeError
from trainyard.kube.events import record_event
from trainyard.api.constants import ANNOTATION_TTL_SECONDS_AFTER_FINISHED, FINALIZER_RESOURCE_IN_USE as FINALIZER
from trainyard.pipeline.elastic import REASON_RESIZE_REFUSED, REASON_RESIZED
from trainyard.pipeline.resolution import finalizer_action, referenced_runtime
from trainyard.pipeline.status_fold import (COMPONENT, RUNTIME_COMPONENTS, comparable, desired_status,
                                             resize_pending, resized, transitions)
from trainyard.pipeline.trainjobs import (REASON_CREATION_FAILED, creation_failed_message, managed_by_trainer,
                                          owned_by_uid, owner_reference)
from trainyard.clock import now_rfc3339
from trainyard.telemetry import detail, metrics
from trainyard.telemetry.tracing import link_to, trainjob_span
from trainyard_services.status import trainjob_metrics
from trainyard_services.status.lifecycle import Lifecycle

log = logging.getLogger(__name__)
_tracer = trace.get_tracer("trainyard.status")

OWN_WRITES_KEPT = 4096  # status writes whose echo event is still expected


@dataclass
class StatusService:
    bus: BusSession
    kube: KubeClient
    cluster: str
    ack_wait_s: float = 30.0
    compat: TrainerCompat = DEFAULT_COMPAT  # --trainer-compat
    partitions: int = field(default_factory=partitions_setting)

    def __post_init__(self) -> None:
        self.lifecycle = Lifecycle(self.kube, self.reconcile_trainjob)
        # resourceVersion of each TrainJob as our own last status write left it: the event of
        # that very version only echoes the write (bounded: a replica may never see the echo).
        self._own_writes: OrderedDict[tuple[str, str], str] = OrderedDict()

    def _echo_of_own_write(self, event: ObjectEvent) -> bool:
        key = (event.namespace, event.name)
        if event.type == "MODIFIED" and self._own_writes.get(key) == event.resource_version:
            del self._own_writes[key]
            return True
        return False

    def _remember_write(self, namespace: str, name: str, written: dict) -> None:
        rv = str((written.get("metadata") or {}).get("resourceVersion") or "")
        if not rv:
            return
        self._own_writes[(namespace, name)] = rv
        self._own_writes.move_to_end((namespace, name))
        while len(self._own_writes) > OWN_WRITES_KEPT:
            self._own_writes.popitem(last=False)

    async def resume_timers(self) -> None:
        """Deadlines and TTLs of TrainJobs that see no event after a restart still come due."""
        def timed(job: dict[str, Any]) -> tuple[str, str] | None:
            meta = job.get("metadata") or {}
            if (job.get("spec") or {}).get("activeDeadlineSeconds") or \
                    ANNOTATION_TTL_SECONDS_AFTER_FINISHED in (meta.get("annotations") or {}):
                return meta.get("namespace") or "", meta["name"]
            return None

        # Picked while the snapshots stream in: only the TrainJobs with a timer are kept.
        for found in await self.bus.snapshots.list(self.cluster, "TrainJob", None, pick=timed):
            if found is not None:
                await self.reconcile_trainjob(*found)

    def subscriptions(self) -> list[Subscription]:
        cluster = self.cluster

        def events(partition: int) -> list[str]:
            # A TrainJob's and its JobSet's events on its partition; the runtimes' (on "all")
            # reach every partition, and the runtime's own partition keeps its finalizer.
            return [event_filter(cluster, "TrainJob", partition), event_filter(cluster, "JobSet", partition),
                    event_filter(cluster, "TrainingRuntime", None), event_filter(cluster, "ClusterTrainingRuntime", None)]

        lane = _namespace_name_lane
        return [
            Subscription(EVENTS_STREAM, "status", events, decoding(ObjectEvent, self.handle_event), ack_wait_s=self.ack_wait_s,
                         max_deliver=5, key_of=lane, coalesce=True),
            # Not coalesced: each failure result records its own Warning event.
            Subscription(RESULTS_STREAM, "status-results", lambda p: [partition_filter(RESULTS_PREFIX, cluster, p)],
                         decoding(ApplyResult, self.handle_result), ack_wait_s=self.ack_wait_s, max_deliver=5, key_of=lane),
        ]

    def subscriber(self) -> PartitionedSubscriber:
        return PartitionedSubscriber(self.bus, "status", self.cluster, self.subscriptions(), service="status",
                                     partitions=self.partitions)

    async def handle_event(self, event: ObjectEvent, delivery: Delivery) -> None:
        if event.kind in RUNTIME_COMPONENTS:
            # Every partition reads it; the runtime's own partition keeps its finalizer.
            if delivery.consumer == partition_durable("status", self.cluster,
                                                      trainjob_partition(event.namespace, event.name, self.partitions)):
                await self.reconcile_runtime(event.kind, event.namespace, event.name, live=True)
            return
        if event.kind == "TrainJob":
            if self._echo_of_own_write(event):
                # Exactly the object our status write produced: its fold is what we wrote, and
                # the runtime reference was checked on the events before it.
                metrics.STATUS_WRITES.labels("own_write_echo").inc()
                return
            runtime = referenced_runtime(event.object)
            if runtime is not None and not self.compat.v2_3:  # v2.3.0 never adds the finalizer
                deleted = event.type == "DELETED"
                await self.reconcile_runtime(*runtime, referenced=not deleted, live=deleted)
            if event.type != "DELETED" and managed_by_trainer(event.object):  # managedBy is immutable: the event's copy tells
                # Folded from the event's copy, not a read of the snapshot: a copy that is no
                # longer current cannot be written back (the status write names its
                # resourceVersion, a conflict reads the live object), and the newer version
                # has an event of its own, handled after this one.
                await self.reconcile_trainjob(event.namespace, event.name, known=event.object)
            return
        owner = owner_reference(event.object)
        if owner and owner.get("name"):
            # A trace of its own (started by the watcher's observation of the child), linked
            # to the TrainJob change that applied it.
            links = []
            if detail.enabled():  # the link is only worth a read when spans leave the process
                applied = (await self.bus.applied.read(applied_key(self.cluster, event.namespace, owner["name"]))).value
                links = link_to(applied.traceparent, owner.get("uid")) if applied is not None else []
            # The event's JobSet is the snapshot's most of the time: then it is not parsed again.
            jobset = event.object if event.kind == "JobSet" and event.name == owner["name"] else None
            with trainjob_span(_tracer, f"fold {event.kind} status", owner.get("uid"), links=links):
                await self.reconcile_trainjob(event.namespace, owner["name"], jobset_copy=jobset)

    async def handle_result(self, result: ApplyResult, delivery: Delivery) -> None:
        if result.outcome in ("failed", "plan-failed"):
            await self.reconcile_trainjob(result.namespace, result.name, result=result)
            return
        if result.outcome == "applied":
            # A success matters only when it clears an earlier failure condition.
            trainjob = await self.bus.snapshots.get(ObjectKey(self.cluster, "TrainJob", result.namespace, result.name))
            conditions = ((trainjob or {}).get("status") or {}).get("conditions") or []
            if any(c.get("reason") in (REASON_CREATION_FAILED, REASON_RESIZE_REFUSED) for c in conditions):
                await self.reconcile_trainjob(result.namespace, result.name)

    async def reconcile_trainjob(self, namespace: str, name: str, result: ApplyResult | None = None,
                                 known: dict[str, Any] | None = None,
                                 jobset_copy: dict[str, Any] | None = None) -> None:
        """``known``: the TrainJob as an event carried it (else the snapshot is read);
        ``jobset_copy``: the JobSet as an event carried it (used when the snapshot is that
        very version)."""
        jobset_key = ObjectKey(self.cluster, "JobSet", namespace, name)
        outcome_key = applied_key(self.cluster, namespace, name)
        # The fold's three reads go out together: one wake-up for their answers, not three.
        if known is not None:
            trainjob = known
            jobset, outcome = await asyncio.gather(self.bus.snapshots.get(jobset_key, known=jobset_copy),
                                                   self.bus.outcomes.get(outcome_key))
        else:
            trainjob, jobset, outcome = await asyncio.gather(
                self.bus.snapshots.get(ObjectKey(self.cluster, "TrainJob", namespace, name)),
                self.bus.snapshots.get(jobset_key, known=jobset_copy), self.bus.outcomes.get(outcome_key))
        for attempt in range(4):
            if trainjob is None:
                return
            if not managed_by_trainer(trainjob):
                return
            uid = trainjob["metadata"].get("uid")
            if attempt:  # after a conflict: the live TrainJob, and what was written beside it since
                jobset, outcome = await asyncio.gather(self.bus.snapshots.get(jobset_key),
                                                       self.bus.outcomes.get(outcome_key))
            if jobset is not None and not owned_by_uid(jobset, uid):
                jobset = None  # left over from an earlier TrainJob of the same name
            before = trainjob.get("status") or {}
            after = desired_status(trainjob, jobset, outcome, now_rfc3339())
            if result is not None and result.uid == uid and result.outcome in ("failed", "plan-failed"):
                if resize_pending(after):
                    await record_event(self.kube, trainjob, "Warning", REASON_RESIZE_REFUSED,
                                       result.message, COMPONENT)
                else:
                    await record_event(self.kube, trainjob, "Warning", REASON_CREATION_FAILED,
                                       creation_failed_message(result.message), COMPONENT)
                result = None
            if comparable(after) == comparable(before):
                metrics.STATUS_WRITES.labels("unchanged").inc()
                await self.lifecycle.after_fold(trainjob, jobset)
                return
            body = dict(trainjob)
            body["status"] = after
            try:
                written = await self.kube.replace_status(r.TRAINJOB, body)
            except KubeError as err:
                if err.not_found:
                    return
                if err.conflict:
                    # Our snapshot is behind: read the live object and fold again.
                    metrics.STATUS_WRITES.labels("conflict").inc()
                    trainjob = await self.kube.get(r.TRAINJOB, namespace, name)
                    if trainjob is not None:
                        trainjob.setdefault("apiVersion", r.TRAINJOB.api_version)
                        trainjob.setdefault("kind", r.TRAINJOB.kind)
                    continue
                metrics.STATUS_WRITES.labels("error").inc()
                raise
            metrics.STATUS_WRITES.labels("written").inc()
            self._remember_write(namespace, name, written)
            trainjob_metrics.observe_transition(trainjob, before, after)
            for condition in transitions(before, after):
                await record_event(self.kube, trainjob, _event_type(condition), condition.get("reason") or
                                   condition.get("type"), condition.get("message") or "", COMPONENT)
            size_change = resized(before, after)
            if size_change is not None:
                await record_event(self.kube, trainjob, "Normal", REASON_RESIZED,
                                   f"resized from {size_change[0]} to {size_change[1]} nodes", COMPONENT)
            await self.lifecycle.after_fold(body, jobset)
            return
        raise RuntimeError(f"status of {namespace}/{name}: conflicts kept coming")

    async def reconcile_runtime(self, kind: str, namespace: str, name: str, *, referenced: bool = False,
                                live: bool = False) -> None:
        """v2.1.0: adds ``resource-in-use`` while TrainJobs reference the runtime; removes it once
        the runtime is being deleted and none does (never from a live runtime), spec §2.4.
        v2.3.0 (upstream's runtime controllers at that tag): removes it whenever it is there.

        ``referenced``: the triggering TrainJob references it (saves listing TrainJobs).
        ``live``: read the runtime from the API server (its snapshot may not show a deletion
        yet when the trigger is another object's event)."""
        resource = r.TRAINING_RUNTIME if kind == "TrainingRuntime" else r.CLUSTER_TRAINING_RUNTIME
        runtime = None if live else await self.bus.snapshots.get(ObjectKey(self.cluster, kind, namespace, name))
        if runtime is None:
            runtime = await self.kube.get(resource, namespace or None, name)
        if runtime is None:
            return
        meta = runtime.get("metadata") or {}
        finalizers = list(meta.get("finalizers") or [])
        has_finalizer = FINALIZER in finalizers
        if self.compat.v2_3:
            if has_finalizer:
                await self._drop_finalizer(resource, kind, namespace, name, meta)
            return
        if finalizer_action(runtime, True) == finalizer_action(runtime, False):
            return  # nothing a reference could change (a live runtime keeps it; none is added while deleting)
        in_use = referenced and not meta.get("deletionTimestamp")
        if not in_use:
            jobs = await self.bus.snapshots.list(self.cluster, "TrainJob", namespace if namespace else None)
            in_use = any(referenced_runtime(j) == (kind, namespace, name) for j in jobs)
        action = finalizer_action(runtime, in_use)
        if action == "add":
            finalizers.append(FINALIZER)
        elif action == "remove":
            finalizers.remove(FINALIZER)
        else:
            return
        patch = {"metadata": {"finalizers": finalizers, "resourceVersion": meta.get("resourceVersion")}}
        try:
            await self.kube.merge_patch(resource, namespace or None, name, patch)
        except KubeError as err:
            if err.not_found:
                return
            if err.conflict:
                # The snapshot was behind: decide again on the live object.
                live = await self.kube.get(resource, namespace or None, name)
                if live is not None and FINALIZER in ((live.get("metadata") or {}).get("finalizers") or []) \
                        and not live["metadata"].get("deletionTimestamp"):
                    return
            raise
        log.info("runtime finalizer updated", extra={"runtime": f"{kind}/{namespace}/{name}",
                                                     "in_use": in_use})

    async def _drop_finalizer(self, resource: Any, kind: str, namespace: str, name: str,
                              meta: dict[str, Any]) -> None:
        finalizers = [f for f in meta.get("finalizers") or [] if f != FINALIZER]
        patch = {"metadata": {"finalizers": finalizers, "resourceVersion": meta.get("resourceVersion")}}
        try:
            await self.kube.merge_patch(resource, namespace or None, name, patch)
        except KubeError as err:
            if err.not_found:
                return
            if err.conflict:  # the snapshot was behind: decide again on the live object
                await self.reconcile_runtime(kind, namespace, name, live=True)
                return
            raise
        log.info("runtime finalizer removed", extra={"runtime": f"{kind}/{namespace}/{name}"})

    async def clean_runtime_finalizers(self) -> None:
        """v2.3.0: runtimes that still carry ``resource-in-use`` (left by v2.1.0 behaviour, or a
        v2.1 controller before) lose it when this service starts, not only on their next event."""
        if not self.compat.v2_3:
            return
        for kind in RUNTIME_COMPONENTS:
            for runtime in await self.bus.snapshots.list(self.cluster, kind):
                meta = runtime.get("metadata") or {}
                if FINALIZER in (meta.get("finalizers") or []):
                    await self.reconcile_runtime(kind, meta.get("namespace") or "", meta.get("name") or "",
                                                 live=True)


def _event_type(condition: dict[str, Any]) -> str:
    return "Warning" if condition.get("type") == "Failed" else "Normal"


def _namespace_name_lane(subject: str) -> str:
    return ".".join(subject.split(".")[-2:])


async def run_status(service: StatusService, stop: asyncio.Event) -> None:
    try:
        await service.resume_timers()
    except Exception:  # noqa: BLE001 - events catch up; timers are only hints
        log.exception("resuming TrainJob timers failed")
    try:
        await service.clean_runtime_finalizers()
    except Exception:  # noqa: BLE001 - each runtime's next event removes it too
        log.exception("removing runtime finalizers failed")

    async def trainjobs() -> list[dict[str, Any]]:
        # Only what the gauge reads, picked as the snapshots stream in (10,000 TrainJobs'
        # whole objects held at once were most of this process's memory).
        return await service.bus.snapshots.list(service.cluster, "TrainJob", pick=trainjob_metrics.gauge_fields)

    async def runtimes() -> list[dict[str, Any]]:
        return [*await service.bus.snapshots.list(service.cluster, "ClusterTrainingRuntime"),
                *await service.bus.snapshots.list(service.cluster, "TrainingRuntime")]

    subscriber = service.subscriber()
    try:
        # One replica recounts: the holder of partition 0 (any one would do; this one is known).
        await asyncio.gather(subscriber.run(stop),
                             trainjob_metrics.keep_state_gauge(trainjobs, stop, list_runtimes=runtimes,
                                                               counting=lambda: 0 in subscriber.owned,
                                                               version=service.bus.snapshots.version))
    finally:
        service.lifecycle.close()
