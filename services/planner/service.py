"""planner: TrainJob/runtime/child events -> one plan per TrainJob on JetStream; webhooks."""
from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass, field
from typing import Any

from trainyard.bus.consumer import Delivery, decoding
from trainyard.bus.envelopes import ObjectEvent
from trainyard.bus.session import BusSession
from trainyard.bus.partitions import PartitionedSubscriber, Subscription
from trainyard.bus.subjects import (ObjectKey, event_filter, partition_of_subject, partitions_setting,
                                    trainjob_partition)
from trainyard.bus.topology import EVENTS_STREAM
from trainyard.compat import DEFAULT_COMPAT, TrainerCompat
from trainyard.errortext import describe
from trainyard.kube import resources as r
from trainyard.kube.client import KubeClient, KubeError
from trainyard.pipeline.framework import Plugin
from trainyard.pipeline.plugins import CHILD_KINDS, REGISTRY
from trainyard.pipeline.snapshot import SNAPSHOT_SUFFIX
from trainyard.pipeline.trainjobs import managed_by_trainer

from trainyard_services.planner.reconcile import (PlannerMemory, affected_trainjobs, forget_trainjob,
                                                  reconcile_trainjob)

log = logging.getLogger(__name__)

ROLE = "planner"
RUNTIME_LIST_KEPT_S = 30.0  # a runtime event's TrainJob list, shared by the partitions of a process


# The name suffixes of what a TrainJob owns: its plugins' children and its runtime snapshot.
CHILD_SUFFIXES = tuple(dict.fromkeys([child.suffix for child in CHILD_KINDS if child.suffix] + [SNAPSHOT_SUFFIX]))


def trainjob_lane(subject: str) -> str:
    """Lane key: namespace + name. Children share their TrainJob's name (a JobSet, PodGroups)
    or add a suffix to it, so one TrainJob's events are handled in order."""
    namespace, name = subject.split(".")[-2:]
    for suffix in CHILD_SUFFIXES:  # encoded tokens keep "-" and letters
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return f"{namespace}.{name}"


@dataclass
class Planner:
    bus: BusSession
    cluster: str
    ack_wait_s: float = 30.0
    plugins: tuple[Plugin, ...] = REGISTRY  # + TrainJobStatus when its feature gate is on
    compat: TrainerCompat = DEFAULT_COMPAT  # --trainer-compat
    partitions: int = field(default_factory=partitions_setting)
    memory: PlannerMemory = field(default_factory=PlannerMemory)
    _runtime_lists: dict[tuple[str, int], asyncio.Future] = field(default_factory=dict)

    async def handle(self, event: ObjectEvent, delivery: Delivery) -> None:
        if event.cluster != self.cluster:
            return
        if event.kind == "TrainJob" and event.type == "DELETED":
            await forget_trainjob(self.bus, self.cluster, event, self.memory)
            return
        if event.kind == "TrainJob" and not managed_by_trainer(event.object):
            return  # e.g. a manager's TrainJob that the dispatcher runs on a worker (managedBy is immutable)
        partition = partition_of_subject(delivery.subject)
        if partition is None:
            # A runtime's event reaches every partition: each plans its own TrainJobs (the
            # TrainJobs referencing it are listed once per process, not once per partition).
            affected = await self._runtime_affected(event, delivery)
            affected = [(ns, name) for ns, name in affected
                        if trainjob_partition(ns, name, self.partitions) in self._owned_partitions(delivery)]
        else:
            affected = await affected_trainjobs(self.bus, event, self.memory)
        for namespace, name in affected:
            outcome = await reconcile_trainjob(self.bus, self.cluster, namespace, name, self.memory, event,
                                               self.plugins, self.compat)
            log.debug("planned", extra={"trainjob": f"{namespace}/{name}", "outcome": outcome})

    def _owned_partitions(self, delivery: Delivery) -> set[int]:
        """The partition whose consumer delivered this runtime event (its durable's name)."""
        return {int(delivery.consumer.split("_", 1)[0].rpartition("-p")[2])}

    async def _runtime_affected(self, event: ObjectEvent, delivery: Delivery) -> list[tuple[str, str]]:
        key = (event.msg_id(), delivery.stream_sequence)
        pending = self._runtime_lists.get(key)
        if pending is None:
            pending = self._runtime_lists[key] = asyncio.ensure_future(affected_trainjobs(self.bus, event, self.memory))
            asyncio.get_running_loop().call_later(RUNTIME_LIST_KEPT_S, self._runtime_lists.pop, key, None)
        return list(await asyncio.shield(pending))

    def subscriptions(self) -> list[Subscription]:
        cluster = self.cluster
        return [Subscription(
            EVENTS_STREAM, ROLE, lambda p: [event_filter(cluster, None, p), event_filter(cluster, None, None)],
            decoding(ObjectEvent, self.handle), ack_wait_s=self.ack_wait_s, max_deliver=5,
            key_of=trainjob_lane, coalesce=True,
        )]

    def subscriber(self) -> PartitionedSubscriber:
        return PartitionedSubscriber(self.bus, ROLE, self.cluster, self.subscriptions(), service="planner",
                                     partitions=self.partitions, on_release=self.memory.forget_partition)


def webhook_trainjob(bus: BusSession, kube: KubeClient, cluster: str):
    """The TrainJob a ``trainjobs/scale`` admission request resizes: the bus's snapshot, else
    the API server's copy (its runtimeRef is what matters, and it is immutable)."""

    async def lookup(namespace: str, name: str) -> dict[str, Any] | None:
        if not _text(namespace) or not _text(name):  # a forged review: no TrainJob is named so
            return None  # (an empty name would GET the whole list)
        try:
            found = await bus.snapshots.get(ObjectKey(cluster, "TrainJob", namespace, name))
        except Exception as err:  # the bus is a cache of the API server: ask the source
            log.warning("bus unavailable for TrainJob %s/%s (%s); asking the API server", namespace, name, describe(err))
            found = None
        if found is None:
            try:
                found = await kube.get(r.TRAINJOB, namespace, name)
            except KubeError as err:
                log.warning("trainjob lookup failed: %s", describe(err))
                return None
        if found is not None:
            found.setdefault("apiVersion", r.TRAINJOB.api_version)
            found.setdefault("kind", r.TRAINJOB.kind)
        return found

    return lookup


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


_OBJECT_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


def _text(value: Any) -> str:
    """A name worth looking up: no object is named otherwise (not even a path to another)."""
    return value if isinstance(value, str) and _OBJECT_NAME.fullmatch(value) else ""


def webhook_observed(bus: BusSession, kube: KubeClient, cluster: str):
    """What the TrainJob webhook rules read: runtime, existing JobSet, PriorityClasses."""

    async def lookup(trainjob: dict[str, Any], *, jobset: bool = True) -> list[dict[str, Any]]:
        """``jobset=False``: the existing JobSet is not read (only the rules of an update read
        it; a create's admission waits on one read less)."""
        # A forged review may hold any shape here: what is not a dict or a string is not looked
        # up (the validation that follows names the field).
        meta = _mapping(trainjob.get("metadata"))
        namespace = _text(meta.get("namespace"))
        name = _text(meta.get("name")) if jobset else ""  # the JobSet is read by this name only
        ref = _mapping(_mapping(trainjob.get("spec")).get("runtimeRef"))
        kind = ref.get("kind", "ClusterTrainingRuntime")
        found: list[dict[str, Any]] = []
        wants_runtime = kind in ("TrainingRuntime", "ClusterTrainingRuntime") and bool(_text(ref.get("name")))
        runtime_ns = namespace if kind == "TrainingRuntime" else ""
        # Both snapshots in one round of concurrent reads (an admission request waits on them).
        runtime_read, jobset_read = await asyncio.gather(
            cached(ObjectKey(cluster, kind, runtime_ns, ref["name"])) if wants_runtime else _nothing(),
            cached(ObjectKey(cluster, "JobSet", namespace, name)) if name else _nothing())
        if wants_runtime:
            runtime, _ = runtime_read
            if runtime is None:  # just created, not yet seen by a watcher (or no bus): ask the API server
                resource = r.TRAINING_RUNTIME if kind == "TrainingRuntime" else r.CLUSTER_TRAINING_RUNTIME
                try:
                    runtime = await kube.get(resource, runtime_ns or None, ref["name"])
                except KubeError as err:
                    log.warning("runtime lookup failed: %s", describe(err))
            if runtime is not None:
                runtime.setdefault("apiVersion", "trainer.kubeflow.org/v1alpha1")
                runtime.setdefault("kind", kind)
                found.append(runtime)
        if name:
            jobset, answered = jobset_read
            if not answered:
                try:
                    jobset = await kube.get(r.JOBSET, namespace, name)
                except KubeError as err:
                    log.warning("jobset lookup failed: %s", describe(err))
            if jobset is not None:
                jobset.setdefault("apiVersion", r.JOBSET.api_version)
                jobset.setdefault("kind", "JobSet")
                found.append(jobset)
        if any(((o.get("spec") or {}).get("podGroupPolicy") or {}).get("volcano") is not None
               for o in found if o.get("kind") == kind):
            try:
                found.extend(await bus.snapshots.list(cluster, "PriorityClass", ""))
            except Exception as err:  # the bus is a cache of the API server: ask the source
                log.warning("bus unavailable for PriorityClasses (%s); asking the API server", describe(err))
                found.extend((await kube.list(r.PRIORITY_CLASS))[0])
        return found

    async def _nothing() -> tuple[None, bool]:
        return None, True

    async def cached(key: ObjectKey) -> tuple[dict[str, Any] | None, bool]:
        """The bus's snapshot and whether the bus answered: admission must not fail while a NATS
        node is away, so a failed read falls back to the API server."""
        try:
            return await bus.snapshots.get(key), True
        except Exception as err:
            log.warning("bus unavailable for %s/%s (%s); asking the API server", key.kind, key.name, describe(err))
            return None, False

    return lookup
