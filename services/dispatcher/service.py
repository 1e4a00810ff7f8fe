"""dispatcher: runs the manager's delegated TrainJobs on worker clusters (MultiKueue-style).

Triggered by TrainJob events on the bus (the manager's TrainJobs, and the worker copies that
the workers' own watchers publish) and by a periodic resync; every pass recomputes from the
API servers (level-triggered), so replicas, duplicates and restarts change nothing.

Guarantees with N replicas: the placement is written to the manager TrainJob (an annotation,
in an update guarded by resourceVersion) *before* any copy is created, and a copy is only
created on the worker that annotation names, so one TrainJob never has two current copies.
Copies on a worker that the manager no longer points at (re-dispatched, or the manager
TrainJob is gone) are deleted by the sweep whenever that worker is reachable.

Home replicas: each replica holds a share of the bus's partitions (trainyard.bus.partitions), as
planner, applier and status do. A TrainJob's events (the manager's and its copies', one
partition: its namespace/name) reach the replica holding that partition, and only that replica
resyncs it, prunes its holds and sweeps its stale copies; so one TrainJob's passes run in one
process, one at a time, and its write echoes reach the process that wrote them. Ownership is a
performance property: the guarantees above hold whichever replicas act on a TrainJob.

Capacity: a TrainJob that may run on a worker holds what its pods request in that worker's
``ty_slots`` entry (trainyard.multicluster.slots), taken with compare-and-set by whichever
replica places or resumes it, so N replicas never overcommit a worker. A suspended TrainJob
holds nothing: it is placed (its copy waits there, suspended) and takes its slots when it is
resumed; while its worker has no room its copy stays suspended and the manager TrainJob says
why (Dispatched=False, InsufficientCapacity, and an Event), and every resync tries again.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from trainyard.clock import now_rfc3339
from trainyard.bus.consumer import Delivery, decoding
from trainyard.bus.envelopes import ObjectEvent
from trainyard.bus.partitions import PartitionedSubscriber, Subscription
from trainyard.bus.session import BusSession
from trainyard.bus.subjects import event_filter, partitions_setting, trainjob_partition
from trainyard.bus.topology import EVENTS_STREAM
from trainyard.errortext import describe
from trainyard.kube import resources as r
from trainyard.kube.client import KubeClient, KubeError
from trainyard.keyed_locks import KeyedLocks
from trainyard.kube.events import record_event
from trainyard.multicluster import delegation as d
from trainyard.multicluster.placement import REASON_NO_CAPACITY, Amounts
from trainyard.multicluster.placer import Placer, trainjob_key as _key
from trainyard.multicluster.registry import WorkerRegistry
from trainyard.multicluster.slots import SlotLedger, hold_key
from trainyard.pipeline.lifecycle import is_finished

log = logging.getLogger(__name__)

ROLE = "dispatcher"
COMPONENT = "trainyard-dispatcher"
FIELD_MANAGER = "trainyard-dispatcher"
REASON_WORKER_LOST = "WorkerLost"
KUEUE_GROUP = "kueue.x-k8s.io"
# Every this many resync passes, every delegated TrainJob is reconciled and every reachable
# worker swept, not only the TrainJobs that wait for a worker.
FULL_RESYNC_EVERY = 15
# A replica fed by the bus lists the manager's TrainJobs (and prunes its holds) every this many
# passes and after it takes a partition; the passes between work from what the events showed.
LIST_EVERY = 5
# Stale copies a sweep deletes at once on one worker.
SWEEP_CONCURRENCY = 8
# How long the mirror of a worker copy's status waits for the copy's next change.
MIRROR_DELAY_S = 0.2
# A copy's event older than this when handled (a replica behind its queue) is only a trigger:
# the pass reads the copy, since a pass may have seen a newer one meanwhile, and mirroring the
# event's would write an older status (then the newer one again).
HINT_FRESH_S = 1.0
# Kueue's Workload API is looked for every this many loops of run_loops (one discovery GET while it
# is absent).
KUEUE_CHECK_EVERY = 5
# Resource versions of this process's own writes remembered per TrainJob: a pass often writes
# twice (placement, then status), and the first write's echo arrives after the second.
OWN_WRITES_KEPT = 4
# A hold younger than this is kept by a resync even if its TrainJob's placement is not listed
# yet (taken by a replica that is writing the placement now; clocks of replicas may differ).
HOLD_GRACE_S = 30.0


def _lane(subject: str) -> str:
    namespace, name = subject.split(".")[-2:]
    return f"{namespace}.{name}"


@dataclass
class Dispatcher:
    bus: BusSession | None
    manager: KubeClient
    cluster: str
    registry: WorkerRegistry
    slots: SlotLedger
    ack_wait_s: float = 30.0
    kueue_present: str | None = None  # why the dispatcher stands down, when it does
    partitions: int = field(default_factory=partitions_setting)
    _locks: KeyedLocks = field(default_factory=KeyedLocks)
    _sweep_now: set[str] = field(default_factory=set)
    _resync_now: bool = False  # a partition was acquired: its waiting TrainJobs are looked at soon
    _sweeping: dict[str, asyncio.Task] = field(default_factory=dict)  # worker -> its sweep in flight
    _namespaces: set[tuple[str, str]] = field(default_factory=set)  # (worker, namespace) known to exist
    _passes: int = 0
    _fresh: set[tuple[str, str, str]] = field(default_factory=set)  # (worker, ns, name) placed just now
    _tasks: set[asyncio.Task] = field(default_factory=set)
    _mirrors: dict[tuple[str, str], tuple[str, dict[str, Any] | None]] = field(default_factory=dict)
    # resourceVersions of this process's last writes of each manager TrainJob: the events those
    # writes cause carry nothing new, and are not worth a pass (a pass of the first write's echo
    # after the second write would only meet a conflict).
    _own_writes: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    _subscriber: PartitionedSubscriber | None = None  # None: no bus, every TrainJob is this process's
    # True when the bus brings this replica the events of its TrainJobs (``subscriber()``): then
    # ``_seen`` holds its delegated manager TrainJobs as last seen (an event, a list, its own
    # write) with when, and most resyncs need no list of every TrainJob of the manager (whose
    # cost grows with the manager's TrainJobs times the replicas).
    fed_by_events: bool = False
    # (None: deleted, or no longer delegated, since the last list.)
    _seen: dict[tuple[str, str], tuple[float, dict[str, Any] | None]] = field(default_factory=dict)
    _list_now: bool = True  # a partition was taken: what it holds is known only from a list
    # (worker, resourceVersion) of the copy each TrainJob's last pass worked from.
    _copy_versions: dict[tuple[str, str], tuple[str, str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.placer = Placer(self.manager, self.cluster, self.registry, self.slots)

    @property
    def placement_seconds(self) -> list[float]:
        """The last placements' decision times (benchmarks read them)."""
        return self.placer.placement_seconds

    # -- triggers ------------------------------------------------------------------------------

    def subscriptions(self) -> list[Subscription]:
        # Every cluster's TrainJob events on one partition: the manager's own, and the worker
        # copies' (their status changes are what the manager mirrors). A copy has its manager
        # TrainJob's namespace and name, so the workers' watchers publish it on the same
        # partition (one partition count per bus): both reach the TrainJob's home replica.
        return [Subscription(
            EVENTS_STREAM, ROLE, lambda p: [event_filter(None, "TrainJob", p)], decoding(ObjectEvent, self.handle),
            ack_wait_s=self.ack_wait_s, max_deliver=5, key_of=_lane, deliver_new_only=True,
            # Every pass reads (or is handed) the newest state: of one object's queued events
            # only the newest needs one (a deletion is always kept).
            coalesce=True,
        )]

    def subscriber(self) -> PartitionedSubscriber:
        """The dispatcher's share of the partitions: it handles the events of their TrainJobs,
        and its resyncs and sweeps look only at those (the home replica of each TrainJob is the
        one that places, mirrors and cleans it up)."""
        assert self.bus is not None
        self._subscriber = PartitionedSubscriber(self.bus, ROLE, self.cluster, self.subscriptions(),
                                                 service=ROLE, partitions=self.partitions,
                                                 on_acquire=self._acquired, on_release=self._forget_partition)
        self.fed_by_events = True
        return self._subscriber

    def owns(self, namespace: str, name: str) -> bool:
        """Whether the TrainJob's partition is this replica's now (always, without a bus)."""
        if self._subscriber is None:
            return True
        return trainjob_partition(namespace, name, self.partitions) in self._subscriber.owned

    def _acquired(self, partition: int) -> None:
        """A partition taken over (a replica stopped or crashed, or this one started): the
        TrainJobs of it that wait for a timer are resynced at the next loop pass, not up to
        --resync-interval later (their events reach this replica through the partition); the
        TrainJobs of it that changed before it was ours are known from that pass's list."""
        self._resync_now = True
        self._list_now = True

    def _forget_partition(self, partition: int) -> None:
        """What this replica remembers of a partition's TrainJobs goes with the partition."""
        for key in [k for k in self._own_writes if trainjob_partition(*k, self.partitions) == partition]:
            del self._own_writes[key]
        for key in [k for k in self._seen if trainjob_partition(*k, self.partitions) == partition]:
            del self._seen[key]
        for key in [k for k in self._copy_versions if trainjob_partition(*k, self.partitions) == partition]:
            del self._copy_versions[key]

    def _remember(self, key: tuple[str, str], trainjob: dict[str, Any] | None) -> None:
        """The newest state of a manager TrainJob this replica saw (None: gone, or not delegated)."""
        self._seen[key] = (time.time(), trainjob if trainjob is not None and d.is_delegated(trainjob) else None)

    async def handle(self, event: ObjectEvent, delivery: Delivery) -> None:
        if self.kueue_present:
            return
        obj = event.object or {}
        meta = obj.get("metadata") or {}
        if event.cluster == self.cluster:
            key = (event.namespace, event.name)
            if event.type == "DELETED":
                self._own_writes.pop(key, None)
                self._copy_versions.pop(key, None)
                self._remember(key, None)
                worker = d.assigned_worker(obj)
                if worker is not None:
                    await self.slots.release(worker, hold_key(*key))
            elif self._own_echo(key, event.resource_version):
                return
            else:
                self._remember(key, obj or None)
                if d.is_delegated(obj):
                    await self.reconcile(event.namespace, event.name, manager=obj)
        elif (meta.get("labels") or {}).get(d.ORIGIN_LABEL) == self.cluster:
            # One of our copies changed on a worker: mirror it (or finish a deletion).
            copy_obj = obj if event.type != "DELETED" and not meta.get("deletionTimestamp") else None
            if copy_obj is None:
                await self.reconcile(event.namespace, event.name, copy_hint=(event.cluster, None))
            else:
                fresh = not delivery.published_at or time.time() - delivery.published_at <= HINT_FRESH_S
                self._mirror_soon(event.namespace, event.name, event.cluster, copy_obj if fresh else None)

    def _own_echo(self, key: tuple[str, str], resource_version: str) -> bool:
        """Whether a manager TrainJob event is the echo of one of this process's last writes."""
        return bool(resource_version) and resource_version in self._own_writes.get(key, ())

    def _mirror_soon(self, namespace: str, name: str, worker: str, copy_obj: dict[str, Any] | None) -> None:
        """Status changes of a copy come in quick runs (created, Suspended, jobsStatus...): the
        manager gets the last of a run, MIRROR_DELAY_S after the first, in one status write.
        A change lost to a crash in that window is mirrored by the next event or full resync."""
        key = (namespace, name)
        pending = key in self._mirrors
        self._mirrors[key] = (worker, copy_obj)
        if not pending:
            self._background(self._mirror_later(key))

    async def _mirror_later(self, key: tuple[str, str]) -> None:
        await asyncio.sleep(MIRROR_DELAY_S)
        worker, copy_obj = self._mirrors.pop(key)
        await self.reconcile(*key, copy_hint=(worker, copy_obj))

    def _waiting(self, trainjob: dict[str, Any]) -> bool:
        """What only a timer can move on: placement retries, lost workers, pending deletions."""
        if trainjob["metadata"].get("deletionTimestamp"):
            return True
        if is_finished(trainjob):
            return False
        worker = d.assigned_worker(trainjob)
        if worker is None or self.registry.is_lost(worker) or self.registry.client(worker) is None:
            return True
        # Resumed (or running) without a hold: waits for room on its worker.
        return not d.suspended(trainjob) and not self.slots.holds(worker, hold_key(*_key(trainjob)))

    async def resync(self) -> None:
        """This replica's delegated TrainJobs that wait for something a timer must notice (every
        one on a full pass, which also sweeps stale copies off reachable workers).

        Fed by the bus, a replica lists the manager's TrainJobs (and prunes its holds) only every
        LIST_EVERY passes and after taking a partition: between lists its TrainJobs' events, and
        its own writes, have shown it the newest state of each."""
        if self._subscriber is not None and not self._subscriber.owned:
            return  # none yet (starting), or none left: the first pass with a share is a full one
        full = self._passes % FULL_RESYNC_EVERY == 0
        if not self.fed_by_events or full or self._list_now or self._passes % LIST_EVERY == 0:
            listed = await self._list_delegated()
            if listed is None:
                return
            delegated = listed  # (when asked, TrainJob)
        else:
            delegated = [(at, tj) for key, (at, tj) in self._seen.items() if tj is not None and self.owns(*key)]
        self._passes += 1
        due = [(at, tj) for at, tj in delegated if full or self._waiting(tj)]
        # A full pass looks at every copy: one list per worker, not a GET per TrainJob (at a
        # CPU limit those GETs made most of a replica's work once it held a few hundred).
        copies = await self._list_copies() if full else {}
        # Each pass starts from what this replica saw newest by the time it runs (the passes
        # of a long resync queue behind the events' passes of the same TrainJobs).
        await asyncio.gather(*(self.reconcile(tj["metadata"]["namespace"], tj["metadata"]["name"], manager=tj,
                                              seen_at=at, copy_hint=self._listed_copy(copies, tj))
                               for at, tj in due))
        if full:
            for worker in self.registry.active():
                self._sweep_soon(worker.name)

    async def _list_copies(self) -> dict[str, dict[tuple[str, str], dict[str, Any]]]:
        """Per reachable worker, this manager's copies there by (namespace, name); a worker that
        does not answer is left out (its TrainJobs' passes read their copies one by one)."""
        listed: dict[str, dict[tuple[str, str], dict[str, Any]]] = {}
        for worker in self.registry.active():
            client = self.registry.client(worker.name)
            if client is None:
                continue
            try:
                answer = await self._copies_on(client)
            except KubeError as err:
                log.debug("resync: copies on %s not listed: %s", worker.name, describe(err))
                continue
            listed[worker.name] = {_key(copy_obj): copy_obj for copy_obj in answer.get("items") or []}
        return listed

    async def _copies_on(self, client: KubeClient) -> dict[str, Any]:
        """The list of this manager's copies on a worker (by their origin label)."""
        return await client.request("GET", r.TRAINJOB.path(), query={"labelSelector": f"{d.ORIGIN_LABEL}={self.cluster}"})

    def _listed_copy(self, copies: dict[str, dict[tuple[str, str], dict[str, Any]]],
                     trainjob: dict[str, Any]) -> tuple[str, dict[str, Any] | None] | None:
        """The copy a full resync listed on the TrainJob's worker, as a pass's hint, when it is
        the very version this replica's last pass used (the list is older than the events that
        may reach the pass first: an older copy would mirror an older status). None: the pass
        reads it."""
        worker = d.assigned_worker(trainjob)
        listed = copies.get(worker) if worker is not None else None
        copy_obj = listed.get(_key(trainjob)) if listed is not None else None
        if copy_obj is None:
            return None
        version = (worker, (copy_obj.get("metadata") or {}).get("resourceVersion"))
        return (worker, copy_obj) if self._copy_versions.get(_key(trainjob)) == version else None

    async def _list_delegated(self) -> list[tuple[float, dict[str, Any]]] | None:
        """This replica's delegated manager TrainJobs, listed, each with when the list was asked
        for; holds of TrainJobs that the list shows not running are pruned. None: the manager
        did not answer."""
        self._list_now = False
        asked_at = time.time()
        try:
            listed = await self.manager.request("GET", r.TRAINJOB.path())
        except KubeError as err:
            log.warning("resync: cannot list TrainJobs: %s", describe(err))
            self._list_now = True
            return None
        delegated = [tj for tj in listed.get("items") or [] if d.is_delegated(tj)]
        await self._prune_holds(delegated, asked_at)
        delegated = [tj for tj in delegated if self.owns(*_key(tj))]
        if self.fed_by_events:
            # What events or writes showed after the list was asked for is newer than the list.
            fresh = {key: seen for key, seen in self._seen.items() if seen[0] >= asked_at}
            self._seen = {_key(tj): (asked_at, tj) for tj in delegated}
            self._seen.update(fresh)
        return [(asked_at, tj) for tj in delegated]

    async def _prune_holds(self, delegated: list[dict[str, Any]], asked_at: float) -> None:
        """Drops the holds of this replica's TrainJobs that no longer run on that worker
        (finished, suspended, gone, moved), taken before the list was asked for; reads every
        worker's entry afresh."""
        running = d.running_on(delegated)
        for worker in list(self.registry.workers):
            keep = running.get(worker, set())
            try:
                dropped = await self.slots.prune(
                    worker, lambda key, at: key not in keep and at < asked_at - HOLD_GRACE_S
                    and self.owns(*key.split("/", 1)))
            except Exception as err:  # the bus is away: the next resync prunes
                log.warning("resync: slots of %s not pruned: %s", worker, describe(err))
                continue
            if dropped:
                log.info("released %d slot holds of TrainJobs no longer running on %s", dropped, worker)

    async def detect_kueue(self) -> None:
        """Kueue's MultiKueue acts on the same managedBy value: never run beside it."""
        found = None
        try:
            group = await self.manager.request("GET", f"/apis/{KUEUE_GROUP}")
        except KubeError:
            group = {}  # not served (the common case), or no answer: asked again at the next check
        served = {entry.get("version") for entry in group.get("versions") or []}
        for version in ("v1beta2", "v1beta1"):
            if version not in served:
                continue
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

    async def reconcile(self, namespace: str, name: str, *, manager: dict[str, Any] | None = None,
                        copy_hint: tuple[str, dict[str, Any] | None] | None = None,
                        seen_at: float | None = None) -> None:
        """One pass over one manager TrainJob. ``manager`` is the TrainJob as an event or a list
        showed it, ``copy_hint`` a worker copy as that worker's event showed it: both save a
        GET, and every write made from them is guarded by resourceVersion, so a stale one can
        only cost a 409 and another pass, never a wrong write."""
        if self.kueue_present:
            return
        async with self._locks.hold((namespace, name)):
            manager = self._newest(namespace, name, manager, seen_at)
            for attempt in range(2):
                try:
                    await self._reconcile(namespace, name, manager, copy_hint)
                    return
                except KubeError as err:
                    if err.conflict and attempt == 0 and manager is not None:
                        # What the pass started from was behind (a resync's list, an event that
                        # arrived after a newer write): once more, with the TrainJob read.
                        manager = None
                        continue
                    if err.conflict:  # another replica (or a newer event) wrote first; it brings another pass
                        log.debug("conflict on %s/%s: %s", namespace, name, describe(err))
                    else:
                        log.warning("dispatch of %s/%s: %s", namespace, name, describe(err))
                    return

    def _newest(self, namespace: str, name: str, manager: dict[str, Any] | None,
                seen_at: float | None) -> dict[str, Any] | None:
        """What a pass starts from: the manager TrainJob it was handed, unless this replica has
        seen a newer state of it since ``seen_at`` (its own write, an event); for a copy's pass
        (handed none), the state this replica last saw. None: it is read."""
        if not self.fed_by_events:
            return manager
        seen = self._seen.get((namespace, name))
        if seen is None or seen[1] is None:
            return manager
        if manager is None or (seen_at is not None and seen[0] > seen_at):
            return seen[1]
        return manager

    async def _reconcile(self, namespace: str, name: str, manager: dict[str, Any] | None,
                         copy_hint: tuple[str, dict[str, Any] | None] | None) -> None:
        if manager is not None:
            trainjob = manager
        else:
            trainjob = await self.manager.get(r.TRAINJOB, namespace, name)
            if self.fed_by_events:
                self._remember((namespace, name), trainjob)
        if trainjob is None or not d.is_delegated(trainjob):
            return  # a hold it had is released by the next resync
        if trainjob["metadata"].get("deletionTimestamp"):
            await self._finalize(trainjob)
            return
        worker = d.assigned_worker(trainjob)
        if worker is not None and self.registry.is_lost(worker) and not is_finished(trainjob):
            trainjob = await self._redispatch(trainjob, worker)
            worker = None
        if worker is None:
            if is_finished(trainjob):
                return
            trainjob, worker = await self._place(trainjob)
            if worker is None:
                return
            self._fresh.add((worker, namespace, name))
        elif d.FINALIZER not in (trainjob["metadata"].get("finalizers") or []):
            trainjob = await self._update(trainjob, finalizers=[*(trainjob["metadata"].get("finalizers") or []),
                                                                d.FINALIZER])
        client = self.registry.client(worker)
        if client is None:
            return  # unreachable for now: nothing to copy or mirror until it answers (or is lost)
        hinted = copy_hint[1] if copy_hint is not None and copy_hint[0] == worker else None
        if hinted is not None and d.copy_is_current(hinted, trainjob, self.cluster):
            copy_obj = hinted
        else:
            copy_obj = await self._ensure_copy(client, worker, trainjob)
        waiting = None
        if copy_obj is not None:
            copy_obj, waiting = await self._hold_and_suspend(client, worker, trainjob, copy_obj)
        if waiting is not None and waiting[0] == "moved":
            # Placed on another worker: this pass goes on there (its copy is created now).
            await self._reconcile(namespace, name, waiting[1], None)
            return
        await self._mirror(trainjob, copy_obj, worker, waiting)
        if copy_obj is not None:
            self._copy_versions[(namespace, name)] = (worker, (copy_obj.get("metadata") or {}).get("resourceVersion"))

    async def _update(self, trainjob: dict[str, Any], *, finalizers: list[str] | None = None,
                      annotations: dict[str, str | None] | None = None) -> dict[str, Any]:
        """A merge patch guarded by resourceVersion: a concurrent writer makes it fail (409)."""
        meta: dict[str, Any] = {"resourceVersion": trainjob["metadata"]["resourceVersion"]}
        if finalizers is not None:
            meta["finalizers"] = finalizers
        if annotations is not None:
            meta["annotations"] = annotations
        return self._wrote(await self.manager.merge_patch(r.TRAINJOB, trainjob["metadata"]["namespace"],
                                                          trainjob["metadata"]["name"], {"metadata": meta}))

    def _wrote(self, trainjob: dict[str, Any]) -> dict[str, Any]:
        meta = trainjob.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        written = self._own_writes.setdefault(key, [])
        written.append(meta.get("resourceVersion", ""))
        del written[:-OWN_WRITES_KEPT]
        if self.fed_by_events:  # its echo is skipped: this is the newest state
            self._remember(key, trainjob)
        return trainjob

    # -- placement -----------------------------------------------------------------------------

    async def _place(self, trainjob: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
        key = _key(trainjob)
        suspended = d.suspended(trainjob)
        # A suspended TrainJob holds nothing: it goes where the runtime is, least loaded first.
        need = {} if suspended else await self.placer.requests(trainjob)
        placement, unknown, took = await self.placer.choose_and_hold(trainjob, need, suspended)
        if placement.worker is None:
            if unknown:
                return trainjob, None  # a worker did not say whether it has the runtime: the next pass asks
            await self._set_dispatched(trainjob, "False", placement.reason, placement.message)
            return trainjob, None
        # The finalizer comes with the placement: one write, and nothing is on a worker before
        # the manager TrainJob is protected from vanishing without clean-up.
        finalizers = trainjob["metadata"].get("finalizers") or []
        try:
            trainjob = await self._update(
                trainjob, annotations={d.WORKER_ANNOTATION: placement.worker},
                finalizers=None if d.FINALIZER in finalizers else [*finalizers, d.FINALIZER])
        except BaseException:
            if took:
                await asyncio.shield(self._give_back(placement.worker, key))
            raise
        log.info("dispatched", extra={"trainjob": f"{key[0]}/{key[1]}", "worker": placement.worker})
        self._background(record_event(self.manager, trainjob, "Normal", "Dispatched", placement.message, COMPONENT))
        return trainjob, placement.worker

    async def _give_back(self, worker: str, key: tuple[str, str]) -> None:
        """After this pass's placement write failed: the hold it took goes back unless the
        TrainJob is placed on ``worker`` after all — by a pass racing this one, which found the
        hold taken and relies on it (one hold per TrainJob). When in doubt it stays: a resync
        prunes a hold of a TrainJob not on its worker (after HOLD_GRACE_S), while giving back a
        hold that a placement relies on lets another TrainJob overcommit the worker."""
        try:
            fresh = await self.manager.get(r.TRAINJOB, *key)
        except Exception as err:
            log.debug("hold of %s/%s on %s kept (TrainJob not read: %s)", *key, worker, describe(err))
            return
        if fresh is not None and d.assigned_worker(fresh) == worker:
            return
        await self.slots.release(worker, hold_key(*key))

    async def _hold_and_suspend(self, client: KubeClient, worker: str, trainjob: dict[str, Any],
                                copy_obj: dict[str, Any]) -> tuple[dict[str, Any] | None, tuple[str, Any] | None]:
        """The copy runs only while its TrainJob holds its slots on the worker: a suspended or
        finished TrainJob gives them back, a resumed one takes them there, or on another worker
        with room (("moved", the manager TrainJob as written)), or its copy stays suspended and
        the returned (reason, message) says why."""
        held_key = hold_key(*_key(trainjob))
        copy_suspended = bool((copy_obj.get("spec") or {}).get("suspend"))
        done = is_finished(trainjob) or is_finished(copy_obj)
        if done or d.suspended(trainjob):
            # A finished copy is released if this process knows its hold (a resync prunes any
            # other); a copy still running while its TrainJob is suspended is released now,
            # the entry read afresh if needed (once: its suspension ends that).
            if self.slots.holds(worker, held_key) or (not done and not copy_suspended):
                await self.slots.release(worker, held_key)
            return await self._propagate_suspend(client, trainjob, copy_obj), None
        if not self.slots.holds(worker, held_key):
            need = await self.placer.requests(trainjob)
            state = self.registry.workers.get(worker)
            # A copy already running (its hold lost, or placed by an older release) is counted
            # as it is; a suspended one is resumed only if it fits.
            fits = None if not copy_suspended or state is None else self.placer.fits(state, need)
            if not await self.slots.reserve(worker, held_key, need, fits):
                moved = await self._move(client, worker, trainjob, copy_obj, need) if fits is not None else None
                if moved is not None:
                    return None, ("moved", moved)
                return copy_obj, (REASON_NO_CAPACITY, self.placer.no_room(worker, need))
        return await self._propagate_suspend(client, trainjob, copy_obj), None

    async def _move(self, client: KubeClient, worker: str, trainjob: dict[str, Any], copy_obj: dict[str, Any],
                    need: Amounts) -> dict[str, Any] | None:
        """A resumed TrainJob whose worker has no room goes to one that has (its copy there is
        suspended and has no pods, so nothing is lost): the hold there first, then the
        placement write, then the old copy's deletion (the sweep deletes it if this fails).
        The manager TrainJob as written, or None when no other worker has room."""
        placement, _, took = await self.placer.choose_and_hold(trainjob, need, False, exclude=worker)
        if placement.worker is None:
            return None
        held_key = hold_key(*_key(trainjob))
        try:
            moved = await self._update(trainjob, annotations={d.WORKER_ANNOTATION: placement.worker})
        except BaseException:
            if took:
                await asyncio.shield(self._give_back(placement.worker, _key(trainjob)))
            raise
        message = f"dispatched to worker cluster {placement.worker} (resumed; worker cluster {worker} had no room)"
        log.info("moved on resume", extra={"trainjob": held_key, "worker": placement.worker})
        self._background(record_event(self.manager, moved, "Normal", "Dispatched", message, COMPONENT))
        meta = copy_obj["metadata"]
        try:
            await client.delete(r.TRAINJOB, meta["namespace"], meta["name"], uid=meta.get("uid"))
        except KubeError as err:
            log.warning("suspended copy %s on %s not deleted (the sweep will): %s", held_key, worker, describe(err))
        self._fresh.add((placement.worker, meta["namespace"], meta["name"]))
        return moved

    async def _redispatch(self, trainjob: dict[str, Any], lost: str) -> dict[str, Any]:
        message = (f"worker cluster {lost} unreachable for more than {self.registry.lost_timeout_s:g}s; "
                   "re-dispatching (its copy is deleted once it is reachable again)")
        trainjob = await self._update(trainjob, annotations={d.WORKER_ANNOTATION: None})
        await self.slots.release(lost, hold_key(*_key(trainjob)))
        log.warning("worker lost", extra={"trainjob": f"{trainjob['metadata']['namespace']}/"
                                                      f"{trainjob['metadata']['name']}", "worker": lost})
        await record_event(self.manager, trainjob, "Warning", REASON_WORKER_LOST, message, COMPONENT)
        # Nothing of the lost copy stays: the status starts over from the next copy.
        return await self._write_status(trainjob, d.mirrored_status(
            trainjob, None, d.dispatched_condition("False", REASON_WORKER_LOST, message, now_rfc3339(), None)))

    async def _set_dispatched(self, trainjob: dict[str, Any], status: str, reason: str,
                              message: str) -> dict[str, Any]:
        previous = d.condition(trainjob, d.CONDITION_DISPATCHED)
        if previous is not None and (previous.get("status"), previous.get("reason"), previous.get("message")) == \
                (status, reason, message):
            return trainjob
        if status == "False" and (previous is None or previous.get("reason") != reason):
            await record_event(self.manager, trainjob, "Warning", reason, message, COMPONENT)
        condition = d.dispatched_condition(status, reason, message, now_rfc3339(), previous)
        return await self._write_status(trainjob, d.with_dispatched(trainjob, condition))

    async def _write_status(self, trainjob: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
        if status == (trainjob.get("status") or {}):
            return trainjob
        body = dict(trainjob)
        body["status"] = status
        return self._wrote(await self.manager.replace_status(r.TRAINJOB, body))

    # -- the copy on the worker ----------------------------------------------------------------

    async def _ensure_copy(self, client: KubeClient, worker: str, trainjob: dict[str, Any]) -> dict[str, Any] | None:
        namespace, name = trainjob["metadata"]["namespace"], trainjob["metadata"]["name"]
        key = (worker, namespace, name)
        existing = None
        if key not in self._fresh:  # right after placement the copy cannot exist: no GET first
            existing = await client.get(r.TRAINJOB, namespace, name)
        self._fresh.discard(key)
        if existing is None:
            await self._copy_dependencies(client, worker, trainjob)
            try:
                return await client.create(r.TRAINJOB, namespace, d.worker_copy(trainjob, self.cluster))
            except KubeError as err:
                if err.status in (400, 403, 422):
                    await self._set_dispatched(trainjob, "False", "CopyRejected",
                                               f"worker cluster {worker} rejected the TrainJob: {err.message}")
                    return None
                if err.status != 409:
                    raise
            existing = await client.get(r.TRAINJOB, namespace, name)  # created meanwhile: whose?
            if existing is None:
                return None
        if not d.copy_is_current(existing, trainjob, self.cluster):
            if (existing["metadata"].get("labels") or {}).get(d.ORIGIN_LABEL) == self.cluster:
                # Left by an earlier TrainJob of the same name: replace it once it is gone.
                await client.delete(r.TRAINJOB, namespace, name, uid=existing["metadata"].get("uid"))
                return None
            await self._set_dispatched(trainjob, "False", "CopyConflict",
                                       f"worker cluster {worker} already has a TrainJob {namespace}/{name} "
                                       "that trainyard did not create")
            return None
        return existing

    async def _propagate_suspend(self, client: KubeClient, trainjob: dict[str, Any],
                                 copy_obj: dict[str, Any]) -> dict[str, Any]:
        wanted = bool((trainjob.get("spec") or {}).get("suspend"))
        if bool((copy_obj.get("spec") or {}).get("suspend")) == wanted:
            return copy_obj
        meta = copy_obj["metadata"]
        return await client.merge_patch(r.TRAINJOB, meta["namespace"], meta["name"], {"spec": {"suspend": wanted}})

    async def _copy_dependencies(self, client: KubeClient, worker: str, trainjob: dict[str, Any]) -> None:
        """The namespace, and the ConfigMaps and Secrets the spec names, read from the manager's
        API and written to the worker's directly (never through the bus)."""
        namespace = trainjob["metadata"]["namespace"]
        if (worker, namespace) not in self._namespaces:
            if await client.get(r.NAMESPACE, None, namespace) is None:
                try:
                    await client.create(r.NAMESPACE, None, {"apiVersion": "v1", "kind": "Namespace",
                                                            "metadata": {"name": namespace}})
                except KubeError as err:
                    if err.status != 409:
                        raise
            self._namespaces.add((worker, namespace))
        configmaps, secrets = d.referenced_objects(trainjob)
        for resource, names in ((r.CONFIGMAP, configmaps), (r.SECRET, secrets)):
            for obj_name in sorted(names):
                source = await self.manager.get(resource, namespace, obj_name)
                if source is None:
                    continue  # the worker's pods will wait for it, as they would on the manager
                await client.apply(d.replica_of(source, self.cluster), field_manager=FIELD_MANAGER)

    async def _mirror(self, trainjob: dict[str, Any], copy_obj: dict[str, Any] | None, worker: str,
                      waiting: tuple[str, str] | None = None) -> None:
        if copy_obj is None:
            return
        previous = d.condition(trainjob, d.CONDITION_DISPATCHED)
        if waiting is not None:
            reason, message = waiting
            if previous is None or previous.get("reason") != reason:
                await record_event(self.manager, trainjob, "Warning", reason, message, COMPONENT)
            dispatched = d.dispatched_condition("False", reason, message, now_rfc3339(), previous)
        else:
            message = f"dispatched to worker cluster {worker}"
            dispatched = d.dispatched_condition("True", "Dispatched", message, now_rfc3339(), previous)
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
        if worker:
            await self.slots.release(worker, hold_key(*_key(trainjob)))
        await self._update(trainjob, finalizers=[f for f in trainjob["metadata"].get("finalizers") or []
                                                 if f != d.FINALIZER])

    async def sweep(self, worker: str) -> int:
        """Deletes this manager's copies on ``worker`` that the manager no longer points at (of
        this replica's partitions).
        Copies are listed before the manager's TrainJobs: a copy is only created after its
        placement was written, so the later list always shows the placement of any copy seen."""
        client = self.registry.client(worker)
        if client is None:
            return 0
        try:
            copies = await self._copies_on(client)
            listed = await self.manager.request("GET", r.TRAINJOB.path())
        except KubeError as err:
            log.debug("sweep of %s skipped: %s", worker, describe(err))
            return 0
        # Another replica's TrainJobs are left to their home replica's sweep.
        stale = [meta for meta in d.stale_copies(copies.get("items") or [], listed.get("items") or [], worker,
                                                 self.cluster) if self.owns(meta["namespace"], meta["name"])]
        slots = asyncio.Semaphore(SWEEP_CONCURRENCY)

        async def delete(meta: dict[str, Any]) -> bool:
            log.info("deleting stale copy", extra={"trainjob": f"{meta['namespace']}/{meta['name']}",
                                                   "worker": worker})
            async with slots:
                try:
                    return await client.delete(r.TRAINJOB, meta["namespace"], meta["name"], uid=meta.get("uid"))
                except KubeError as err:
                    log.warning("stale copy %s/%s on %s not deleted: %s", meta["namespace"], meta["name"], worker,
                                describe(err))
                    return False

        return sum(await asyncio.gather(*(delete(meta) for meta in stale)))

    def _sweep_soon(self, worker: str) -> None:
        """Sweeps run beside placement and mirroring, never in their way: a worker back from an
        outage may hold hundreds of stale copies, and its deletions take as long as they take."""
        running = self._sweeping.get(worker)
        if running is not None and not running.done():
            return  # the next full resync sweeps again
        task = asyncio.ensure_future(self.sweep(worker))
        self._sweeping[worker] = task

        def finished(done: asyncio.Task) -> None:
            if not done.cancelled() and done.exception() is not None:
                log.warning("sweep of %s failed: %s", worker, describe(done.exception()))

        task.add_done_callback(finished)

    # -- loops ---------------------------------------------------------------------------------

    async def run_loops(self, stop: asyncio.Event, probe_interval_s: float, resync_interval_s: float) -> None:
        """Registry refresh (reachability, capacity), Kueue detection and the periodic resync."""
        next_resync = 0.0
        loops = 0
        while not stop.is_set():
            try:
                if loops % KUEUE_CHECK_EVERY == 0:
                    await self.detect_kueue()
                loops += 1
                await self.registry.refresh()
                for worker in sorted(self._sweep_now):
                    self._sweep_now.discard(worker)
                    self._sweep_soon(worker)
                if not self.kueue_present and (time.monotonic() >= next_resync or self._resync_now):
                    self._resync_now = False
                    await self.resync()
                    next_resync = time.monotonic() + resync_interval_s
            except Exception:  # one failed pass must not end the loop
                log.exception("dispatcher pass failed")
            try:
                await asyncio.wait_for(stop.wait(), timeout=probe_interval_s)
            except asyncio.TimeoutError:
                pass

    def _background(self, coroutine) -> None:
        """Best-effort work off the critical path (Events): kept referenced until done."""
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def worker_reachable(self, name: str) -> None:
        """A worker came back: its stale copies go at the next pass; what it had may be gone."""
        self._sweep_now.add(name)
        self._namespaces = {(worker, ns) for worker, ns in self._namespaces if worker != name}
