"""dispatcher: runs the manager's delegated TrainJobs on worker clusters (MultiKueue-style).

Triggered by TrainJob events on the bus (the manager's TrainJobs, and the worker copies that
the workers' own watchers publish) and by a periodic resync; every pass recomputes from the
API servers (level-triggered), so replicas, duplicates and restarts change nothing.

Guarantees with N replicas: the placement is written to the manager TrainJob (an annotation,
in an update guarded by resourceVersion) *before* any copy is created, and a copy is only
created on the worker that annotation names, so one TrainJob never has two current copies.
Copies on a worker that the manager no longer points at (re-dispatched, or the manager
TrainJob is gone) are deleted by the sweep whenever that worker is reachable.
"""
from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from trainyard.bus.consumer import Consumer, Delivery, PermanentError
from trainyard.bus.envelopes import EnvelopeError, ObjectEvent, decode
from trainyard.bus.session import BusSession
from trainyard.bus.subjects import EVENTS_PREFIX, encode_token
from trainyard.bus.topology import EVENTS_STREAM, ConsumerSpec, durable_name
from trainyard.kube import resources as r
from trainyard.kube.client import KubeClient, KubeError
from trainyard.kube.events import record_event
from trainyard.multicluster import delegation as d
from trainyard.multicluster.placement import Amounts, Worker, choose_worker, node_allocatable, \
    plan_requests, pods_in_use
from trainyard.multicluster.registry import WorkerRegistry
from trainyard.pipeline.errors import PlanningError
from trainyard.pipeline.planning import plan

log = logging.getLogger(__name__)

ROLE = "dispatcher"
COMPONENT = "trainyard-dispatcher"
FIELD_MANAGER = "trainyard-dispatcher"
REASON_WORKER_LOST = "WorkerLost"
KUEUE_GROUP = "kueue.x-k8s.io"


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _no_ssh_key() -> tuple[bytes, bytes]:
    return b"", b""  # placement only sums requests: an MPI plan needs no real key here


def _lane(subject: str) -> str:
    namespace, name = subject.split(".")[-2:]
    return f"{namespace}.{name}"


@dataclass
class Dispatcher:
    bus: BusSession | None
    manager: KubeClient
    cluster: str
    registry: WorkerRegistry
    ack_wait_s: float = 30.0
    # Placements this process made that a later manager list may not show yet, and every
    # dispatched TrainJob's requests: placement counts them against their worker until the
    # worker's pods exist.
    assignments: dict[tuple[str, str], tuple[str, Amounts, bool]] = field(default_factory=dict)
    kueue_present: str | None = None  # why the dispatcher stands down, when it does
    _locks: dict[tuple[str, str], asyncio.Lock] = field(default_factory=dict)
    _placement_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _sweep_now: set[str] = field(default_factory=set)

    # -- triggers ------------------------------------------------------------------------------

    def consumer_spec(self) -> ConsumerSpec:
        # Every cluster's TrainJob events: the manager's own, and the worker copies' (their
        # status changes are what the manager mirrors).
        return ConsumerSpec(EVENTS_STREAM, durable_name(ROLE, self.cluster),
                            [f"{EVENTS_PREFIX}.*.{encode_token('TrainJob')}.*.*"],
                            ack_wait_s=self.ack_wait_s, max_deliver=5, deliver_new_only=True)

    def consumer(self) -> Consumer:
        assert self.bus is not None
        return Consumer(self.bus.js, self.consumer_spec(), self.handle, service=ROLE,
                        publisher=self.bus.publisher, key_of=_lane)

    async def handle(self, delivery: Delivery) -> None:
        try:
            event = decode(ObjectEvent, delivery.data)
        except EnvelopeError as err:
            raise PermanentError(str(err)) from None
        if self.kueue_present:
            return
        obj = event.object or {}
        meta = obj.get("metadata") or {}
        if event.cluster == self.cluster:
            if event.type != "DELETED" and not d.is_delegated(obj):
                return
        elif (meta.get("labels") or {}).get(d.ORIGIN_LABEL) != self.cluster:
            return  # a worker's own TrainJob, not one of our copies
        await self.reconcile(event.namespace, event.name)

    async def resync(self) -> None:
        """Every delegated TrainJob once (retries placement, notices lost workers), then the
        sweep of stale copies on reachable workers."""
        try:
            listed = await self.manager.request("GET", r.TRAINJOB.path())
        except KubeError as err:
            log.warning("resync: cannot list TrainJobs: %s", err)
            return
        delegated = [tj for tj in listed.get("items") or [] if d.is_delegated(tj)]
        known = {(tj["metadata"]["namespace"], tj["metadata"]["name"]) for tj in delegated}
        for key in list(self.assignments):
            if key not in known:
                self.assignments.pop(key, None)
        await asyncio.gather(*(self.reconcile(tj["metadata"]["namespace"], tj["metadata"]["name"])
                               for tj in delegated))
        for worker in self.registry.active():
            await self.sweep(worker.name)

    async def detect_kueue(self) -> None:
        """Kueue's MultiKueue acts on the same managedBy value: never run beside it."""
        found = None
        for version in ("v1beta2", "v1beta1"):
            try:
                resources = await self.manager.request("GET", f"/apis/{KUEUE_GROUP}/{version}")
            except KubeError:
                continue
            if any(res.get("name") == "workloads" for res in resources.get("resources") or []):
                found = f"the manager cluster serves workloads.{KUEUE_GROUP}/{version}: Kueue is installed, " \
                        "and its MultiKueue dispatches TrainJobs with managedBy kueue.x-k8s.io/multikueue; " \
                        "the trainyard dispatcher stands down"
                break
        if found and not self.kueue_present:
            log.warning(found)
            await record_event(self.manager, {"apiVersion": "v1", "kind": "Namespace",
                                              "metadata": {"name": self.registry.secrets_namespace,
                                                           "namespace": self.registry.secrets_namespace}},
                               "Warning", "KueueInstalled", found, COMPONENT)
        elif self.kueue_present and not found:
            log.info("Kueue's Workload API is gone; dispatching")
        self.kueue_present = found

    # -- one TrainJob --------------------------------------------------------------------------

    async def reconcile(self, namespace: str, name: str) -> None:
        if self.kueue_present:
            return
        lock = self._locks.setdefault((namespace, name), asyncio.Lock())
        async with lock:
            try:
                await self._reconcile(namespace, name)
            except KubeError as err:
                if err.conflict:  # another replica wrote first; its write triggers another pass
                    log.debug("conflict on %s/%s: %s", namespace, name, err)
                else:
                    log.warning("dispatch of %s/%s: %s", namespace, name, err)
        if not lock.locked():
            self._locks.pop((namespace, name), None)

    async def _reconcile(self, namespace: str, name: str) -> None:
        trainjob = await self.manager.get(r.TRAINJOB, namespace, name)
        if trainjob is None or not d.is_delegated(trainjob):
            self.assignments.pop((namespace, name), None)
            return
        if trainjob["metadata"].get("deletionTimestamp"):
            await self._finalize(trainjob)
            return
        if d.FINALIZER not in (trainjob["metadata"].get("finalizers") or []):
            trainjob = await self._update(trainjob, finalizers=[*(trainjob["metadata"].get("finalizers") or []),
                                                                d.FINALIZER])
        worker = d.assigned_worker(trainjob)
        if worker is not None and self.registry.is_lost(worker) and not d.finished(trainjob):
            trainjob = await self._redispatch(trainjob, worker)
            worker = None
        if worker is None:
            if d.finished(trainjob):
                return
            trainjob, worker = await self._place(trainjob)
            if worker is None:
                return
        client = self.registry.client(worker)
        if client is None:
            return  # unreachable for now: nothing to copy or mirror until it answers (or is lost)
        copy_obj = await self._ensure_copy(client, worker, trainjob)
        await self._mirror(trainjob, copy_obj, worker)

    async def _update(self, trainjob: dict[str, Any], *, finalizers: list[str] | None = None,
                      annotations: dict[str, str | None] | None = None) -> dict[str, Any]:
        """A merge patch guarded by resourceVersion: a concurrent writer makes it fail (409)."""
        meta: dict[str, Any] = {"resourceVersion": trainjob["metadata"]["resourceVersion"]}
        if finalizers is not None:
            meta["finalizers"] = finalizers
        if annotations is not None:
            meta["annotations"] = annotations
        return await self.manager.merge_patch(r.TRAINJOB, trainjob["metadata"]["namespace"],
                                              trainjob["metadata"]["name"], {"metadata": meta})

    # -- placement -----------------------------------------------------------------------------

    async def _requests(self, trainjob: dict[str, Any]) -> Amounts:
        """What the TrainJob's pods will request, planned with the manager's copy of its runtime."""
        ref = (trainjob.get("spec") or {}).get("runtimeRef") or {}
        kind = ref.get("kind") or "ClusterTrainingRuntime"
        resource = r.TRAINING_RUNTIME if kind == "TrainingRuntime" else r.CLUSTER_TRAINING_RUNTIME
        runtime_ns = trainjob["metadata"]["namespace"] if kind == "TrainingRuntime" else None
        runtime = await self.manager.get(resource, runtime_ns, ref.get("name") or "")
        if runtime is None:
            return {}
        try:
            return plan_requests(plan(trainjob, runtime, new_ssh_key=_no_ssh_key).objects)
        except PlanningError:
            return {}  # the worker's trainyard reports the planning error on the copy

    async def _has_runtime(self, client: KubeClient, trainjob: dict[str, Any]) -> bool:
        ref = (trainjob.get("spec") or {}).get("runtimeRef") or {}
        kind = ref.get("kind") or "ClusterTrainingRuntime"
        resource = r.TRAINING_RUNTIME if kind == "TrainingRuntime" else r.CLUSTER_TRAINING_RUNTIME
        runtime_ns = trainjob["metadata"]["namespace"] if kind == "TrainingRuntime" else None
        try:
            return await client.get(resource, runtime_ns, ref.get("name") or "", timeout_s=5.0) is not None
        except KubeError:
            return False

    def _worker_view(self, name: str, nodes: list, pods: list, has_runtime: bool) -> Worker:
        ours = {key: need for key, (worker, need, active) in self.assignments.items() if worker == name and active}
        used = pods_in_use(pods, excluded=set(ours))
        for need in ours.values():
            for resource, amount in need.items():
                used[resource] = used.get(resource, Fraction(0)) + amount
        return Worker(name, node_allocatable(nodes), used, has_runtime)

    async def _place(self, trainjob: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
        key = (trainjob["metadata"]["namespace"], trainjob["metadata"]["name"])
        need = await self._requests(trainjob)
        runtime = ((trainjob.get("spec") or {}).get("runtimeRef") or {}).get("name") or ""
        async with self._placement_lock:  # one decision at a time sees the previous one's load
            active = self.registry.active()
            presence = await asyncio.gather(*(self._has_runtime(w.client, trainjob) for w in active))
            views = [self._worker_view(w.name, w.nodes, w.pods, has) for w, has in zip(active, presence)]
            placement = choose_worker(need, views, runtime)
            if placement.worker is None:
                await self._set_dispatched(trainjob, "False", placement.reason, placement.message)
                return trainjob, None
            trainjob = await self._update(trainjob, annotations={d.WORKER_ANNOTATION: placement.worker})
            self.assignments[key] = (placement.worker, need, True)
        log.info("dispatched", extra={"trainjob": f"{key[0]}/{key[1]}", "worker": placement.worker})
        await record_event(self.manager, trainjob, "Normal", "Dispatched", placement.message, COMPONENT)
        trainjob = await self._set_dispatched(trainjob, "True", "Dispatched", placement.message)
        return trainjob, placement.worker

    async def _redispatch(self, trainjob: dict[str, Any], lost: str) -> dict[str, Any]:
        message = (f"worker cluster {lost} unreachable for more than {self.registry.lost_timeout_s:g}s; "
                   "re-dispatching (its copy is deleted once it is reachable again)")
        trainjob = await self._update(trainjob, annotations={d.WORKER_ANNOTATION: None})
        self.assignments.pop((trainjob["metadata"]["namespace"], trainjob["metadata"]["name"]), None)
        log.warning("worker lost", extra={"trainjob": f"{trainjob['metadata']['namespace']}/"
                                                      f"{trainjob['metadata']['name']}", "worker": lost})
        await record_event(self.manager, trainjob, "Warning", REASON_WORKER_LOST, message, COMPONENT)
        # Nothing of the lost copy stays: the status starts over from the next copy.
        return await self._write_status(trainjob, d.mirrored_status(
            trainjob, None, d.dispatched_condition("False", REASON_WORKER_LOST, message, _now(), None)))

    async def _set_dispatched(self, trainjob: dict[str, Any], status: str, reason: str,
                              message: str) -> dict[str, Any]:
        previous = d.condition(trainjob, d.CONDITION_DISPATCHED)
        if previous is not None and (previous.get("status"), previous.get("reason"), previous.get("message")) == \
                (status, reason, message):
            return trainjob
        if status == "False" and (previous is None or previous.get("reason") != reason):
            await record_event(self.manager, trainjob, "Warning", reason, message, COMPONENT)
        condition = d.dispatched_condition(status, reason, message, _now(), previous)
        current = dict(trainjob.get("status") or {})
        conditions = [c for c in current.get("conditions") or [] if c.get("type") != d.CONDITION_DISPATCHED]
        current["conditions"] = [condition, *conditions]
        return await self._write_status(trainjob, current)

    async def _write_status(self, trainjob: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
        if status == (trainjob.get("status") or {}):
            return trainjob
        body = dict(trainjob)
        body["status"] = status
        return await self.manager.replace_status(r.TRAINJOB, body)

    # -- the copy on the worker ----------------------------------------------------------------

    async def _ensure_copy(self, client: KubeClient, worker: str, trainjob: dict[str, Any]) -> dict[str, Any] | None:
        namespace, name = trainjob["metadata"]["namespace"], trainjob["metadata"]["name"]
        existing = await client.get(r.TRAINJOB, namespace, name)
        if existing is not None and not d.copy_is_current(existing, trainjob, self.cluster):
            if ((existing["metadata"].get("labels") or {}).get(d.ORIGIN_LABEL) == self.cluster):
                # Left by an earlier TrainJob of the same name: replace it once it is gone.
                await client.delete(r.TRAINJOB, namespace, name, uid=existing["metadata"].get("uid"))
                return None
            await self._set_dispatched(trainjob, "False", "CopyConflict",
                                       f"worker cluster {worker} already has a TrainJob {namespace}/{name} "
                                       "that trainyard did not create")
            return None
        if existing is None:
            await self._copy_dependencies(client, trainjob)
            try:
                return await client.create(r.TRAINJOB, namespace, d.worker_copy(trainjob, self.cluster))
            except KubeError as err:
                if err.status == 409:  # another replica created it a moment ago
                    return await client.get(r.TRAINJOB, namespace, name)
                if err.status in (400, 403, 422):
                    await self._set_dispatched(trainjob, "False", "CopyRejected",
                                               f"worker cluster {worker} rejected the TrainJob: {err.message}")
                    return None
                raise
        wanted = bool((trainjob.get("spec") or {}).get("suspend"))
        if bool((existing.get("spec") or {}).get("suspend")) != wanted:
            existing = await client.merge_patch(r.TRAINJOB, namespace, name, {"spec": {"suspend": wanted}})
        return existing

    async def _copy_dependencies(self, client: KubeClient, trainjob: dict[str, Any]) -> None:
        """The namespace, and the ConfigMaps and Secrets the spec names, read from the manager's
        API and written to the worker's directly (never through the bus)."""
        namespace = trainjob["metadata"]["namespace"]
        if await client.get(r.NAMESPACE, None, namespace) is None:
            try:
                await client.create(r.NAMESPACE, None, {"apiVersion": "v1", "kind": "Namespace",
                                                        "metadata": {"name": namespace}})
            except KubeError as err:
                if err.status != 409:
                    raise
        configmaps, secrets = d.referenced_objects(trainjob)
        for resource, names in ((r.CONFIGMAP, configmaps), (r.SECRET, secrets)):
            for obj_name in sorted(names):
                source = await self.manager.get(resource, namespace, obj_name)
                if source is None:
                    continue  # the worker's pods will wait for it, as they would on the manager
                await client.apply(d.replica_of(source, self.cluster), field_manager=FIELD_MANAGER)

    async def _mirror(self, trainjob: dict[str, Any], copy_obj: dict[str, Any] | None, worker: str) -> None:
        if copy_obj is None:
            return
        key = (trainjob["metadata"]["namespace"], trainjob["metadata"]["name"])
        need = self.assignments.get(key, (worker, {}, True))[1]
        self.assignments[key] = (worker, need, not d.finished(copy_obj))
        dispatched = d.condition(trainjob, d.CONDITION_DISPATCHED) or d.dispatched_condition(
            "True", "Dispatched", f"dispatched to worker cluster {worker}", _now(), None)
        await self._write_status(trainjob, d.mirrored_status(trainjob, copy_obj, dispatched))

    # -- deletion and stale copies -------------------------------------------------------------

    async def _finalize(self, trainjob: dict[str, Any]) -> None:
        if d.FINALIZER not in (trainjob["metadata"].get("finalizers") or []):
            return
        worker = d.assigned_worker(trainjob)
        client = self.registry.client(worker) if worker else None
        if worker and client is not None:
            namespace, name = trainjob["metadata"]["namespace"], trainjob["metadata"]["name"]
            existing = await client.get(r.TRAINJOB, namespace, name)
            if existing is not None and d.copy_is_current(existing, trainjob, self.cluster):
                await client.delete(r.TRAINJOB, namespace, name, uid=existing["metadata"].get("uid"))
                return  # the copy's DELETED event (or the resync) brings us back
        elif worker and not self.registry.is_lost(worker):
            return  # unreachable for now: wait until it answers or is lost
        self.assignments.pop((trainjob["metadata"]["namespace"], trainjob["metadata"]["name"]), None)
        await self._update(trainjob, finalizers=[f for f in trainjob["metadata"].get("finalizers") or []
                                                 if f != d.FINALIZER])

    async def sweep(self, worker: str) -> int:
        """Deletes this manager's copies on ``worker`` that the manager no longer points at.
        Copies are listed before the manager's TrainJobs: a copy is only created after its
        placement was written, so the later list always shows the placement of any copy seen."""
        client = self.registry.client(worker)
        if client is None:
            return 0
        try:
            copies = await client.request("GET", r.TRAINJOB.path(),
                                          query={"labelSelector": f"{d.ORIGIN_LABEL}={self.cluster}"})
            listed = await self.manager.request("GET", r.TRAINJOB.path())
        except KubeError as err:
            log.debug("sweep of %s skipped: %s", worker, err)
            return 0
        manager = {(tj["metadata"]["namespace"], tj["metadata"]["name"]): tj for tj in listed.get("items") or []}
        deleted = 0
        for copy_obj in copies.get("items") or []:
            meta = copy_obj["metadata"]
            if meta.get("deletionTimestamp"):
                continue
            owner = manager.get((meta["namespace"], meta["name"]))
            if owner is not None and d.assigned_worker(owner) == worker \
                    and d.copy_is_current(copy_obj, owner, self.cluster):
                continue
            log.info("deleting stale copy", extra={"trainjob": f"{meta['namespace']}/{meta['name']}",
                                                   "worker": worker})
            try:
                await client.delete(r.TRAINJOB, meta["namespace"], meta["name"], uid=meta.get("uid"))
                deleted += 1
            except KubeError as err:
                log.warning("stale copy %s/%s on %s not deleted: %s", meta["namespace"], meta["name"], worker, err)
        return deleted

    # -- loops ---------------------------------------------------------------------------------

    async def run_loops(self, stop: asyncio.Event, probe_interval_s: float, resync_interval_s: float) -> None:
        """Registry refresh (reachability, capacity), Kueue detection and the periodic resync."""
        next_resync = 0.0
        while not stop.is_set():
            try:
                await self.detect_kueue()
                await self.registry.refresh()
                for worker in sorted(self._sweep_now):
                    self._sweep_now.discard(worker)
                    await self.sweep(worker)
                if not self.kueue_present and time.monotonic() >= next_resync:
                    await self.resync()
                    next_resync = time.monotonic() + resync_interval_s
            except Exception:  # one failed pass must not end the loop
                log.exception("dispatcher pass failed")
            try:
                await asyncio.wait_for(stop.wait(), timeout=probe_interval_s)
            except asyncio.TimeoutError:
                pass

    def worker_reachable(self, name: str) -> None:
        """A worker came back: its stale copies go at the next pass."""
        self._sweep_now.add(name)
