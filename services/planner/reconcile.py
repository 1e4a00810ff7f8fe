"""Planning one TrainJob from the KV snapshots (level-triggered: the event is only a hint)."""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections import OrderedDict
from datetime import datetime, timezone
from dataclasses import dataclass
from typing import Any

from trainyard.bus.envelopes import ApplyResult, ObjectEvent, ObjectRef, PlanMessage
from trainyard.bus.kv import Outcome
from trainyard.bus.session import BusSession
from trainyard.bus.subjects import ObjectKey, bus_kind, plan_subject, result_subject, trainjob_partition
from trainyard.compat import DEFAULT_COMPAT, TrainerCompat
from trainyard.pipeline.errors import PlanningError
from trainyard.pipeline.lifecycle import deadline_exceeded, is_finished
from trainyard.pipeline.framework import Plugin
from trainyard.pipeline.planning import plan, plan_hash
from trainyard.pipeline.plugins import CHILD_KINDS, REGISTRY
from trainyard.pipeline.snapshot import SNAPSHOT_KEY, parsed_snapshot, snapshot_name
from trainyard.pipeline.curve_keys import deferred_curve_key
from trainyard.pipeline.ssh_keys import defer_generated_secrets, deferred_ssh_key
from trainyard.pipeline.trainjobs import REASON_CREATION_FAILED, managed_by_trainer, owner_reference
from trainyard.telemetry import metrics

log = logging.getLogger(__name__)

GROUP = "trainer.kubeflow.org"
TRAINJOB_API_VERSION = f"{GROUP}/v1alpha1"



def applied_store_key(cluster: str, namespace: str, name: str) -> str:
    from trainyard.bus.kv import applied_key

    return applied_key(cluster, namespace, name)


def owner_of(obj: dict[str, Any]) -> str | None:
    """The name of the TrainJob that controls ``obj``, if any."""
    ref = owner_reference(obj)
    return ref.get("name") if ref is not None else None


def references_runtime(trainjob: dict[str, Any], kind: str, name: str) -> bool:
    ref = (trainjob.get("spec") or {}).get("runtimeRef") or {}
    return ref.get("name") == name and ref.get("kind", "ClusterTrainingRuntime") == kind \
        and ref.get("apiGroup", GROUP) == GROUP


async def affected_trainjobs(bus: BusSession, event: ObjectEvent, memory: PlannerMemory) -> list[tuple[str, str]]:
    """(namespace, name) of every TrainJob whose plan may change because of ``event``."""
    if event.kind == "TrainJob":
        return [(event.namespace, event.name)]
    if event.kind in ("TrainingRuntime", "ClusterTrainingRuntime"):
        if event.type != "DELETED" and not memory.runtime_spec_changed(event):
            return []  # metadata-only change (e.g. the in-use finalizer): plans do not change
        namespace = event.namespace if event.kind == "TrainingRuntime" else None
        jobs = await bus.snapshots.list(event.cluster, "TrainJob", namespace)
        return [
            ((j["metadata"].get("namespace") or ""), j["metadata"]["name"])
            for j in jobs if references_runtime(j, event.kind, event.name)
        ]
    if event.kind == "PriorityClass":
        return []  # read when planning Volcano PodGroups; changes do not re-plan (as upstream)
    owner = owner_of(event.object)
    return [(event.namespace, owner)] if owner else []


def stored_runtime(snapshot: dict[str, Any] | None) -> dict[str, Any] | None:
    """The runtime a snapshot ConfigMap holds, None when it holds none readable (planning
    reports why)."""
    text = ((snapshot or {}).get("data") or {}).get(SNAPSHOT_KEY)
    if not isinstance(text, str):
        return None
    try:
        document = parsed_snapshot(text)
    except Exception:  # noqa: BLE001 - not YAML: planning answers with upstream's error
        return None
    return document if isinstance(document, dict) else None


def _uses_volcano(runtime: dict[str, Any] | None) -> bool:
    return bool(((runtime or {}).get("spec") or {}).get("podGroupPolicy", {}).get("volcano") is not None)


def observed_keys(cluster: str, trainjob: dict[str, Any]) -> list[ObjectKey]:
    """The snapshots planning reads for ``trainjob``: its runtime, then its possible children."""
    meta = trainjob.get("metadata") or {}
    namespace, name = meta.get("namespace") or "", meta.get("name") or ""
    ref = (trainjob.get("spec") or {}).get("runtimeRef") or {}
    runtime_kind = ref.get("kind", "ClusterTrainingRuntime")
    keys: list[ObjectKey] = []
    if runtime_kind in ("TrainingRuntime", "ClusterTrainingRuntime") and ref.get("name"):
        runtime_ns = namespace if runtime_kind == "TrainingRuntime" else ""
        keys.append(ObjectKey(cluster, runtime_kind, runtime_ns, ref["name"]))
    keys.extend(ObjectKey(cluster, bus_kind(child.api_version, child.kind), namespace, child.name_for(name))
                for child in CHILD_KINDS)
    keys.append(snapshot_key(cluster, namespace, name))
    return keys


def snapshot_key(cluster: str, namespace: str, name: str) -> ObjectKey:
    """The TrainJob's runtime snapshot (v2.3.0): read whoever owns it, since planning answers a
    snapshot owned by another object with upstream's error. Not among CHILD_KINDS: planning that
    leaves the children out (``owned_refs``) still plans from it."""
    return ObjectKey(cluster, "ConfigMap", namespace, snapshot_name(name))


@dataclass(frozen=True)
class Prefetched:
    """Snapshots read together with the TrainJob's own, in the same batched read."""

    keys: list[ObjectKey]
    objects: list[dict[str, Any] | None]


async def observed_objects(bus: BusSession, cluster: str, trainjob: dict[str, Any],
                           prefetched: Prefetched | None = None) -> list[dict[str, Any]]:
    """Everything planning may read: the runtime, the owned children, PriorityClasses.
    ``prefetched``: the same keys, read with the TrainJob (then they are not read again)."""
    meta = trainjob["metadata"]
    keys = observed_keys(cluster, trainjob)
    if prefetched is not None and prefetched.keys == keys:
        objects = prefetched.objects
    else:
        # One batched read (most of these do not exist) instead of one round trip per object.
        objects = await bus.snapshots.get_many(keys)
    found: list[dict[str, Any]] = []
    snapshot_at = snapshot_key(cluster, meta.get("namespace") or "", meta["name"])
    for key, obj in zip(keys, objects):
        if obj is None:
            continue
        if key.kind in ("TrainingRuntime", "ClusterTrainingRuntime") or key == snapshot_at \
                or _owned_by(obj, meta.get("uid")):
            found.append(obj)
    runtimes = [o for o in found if o.get("kind") in ("TrainingRuntime", "ClusterTrainingRuntime")]
    snapshot = next((o for o in found if o.get("kind") == "ConfigMap"
                     and (o.get("metadata") or {}).get("name") == snapshot_at.name), None)
    # Planning reads the snapshot's runtime when there is one (v2.3), which may be all that is
    # left of a deleted runtime.
    if any(_uses_volcano(r) for r in runtimes) or _uses_volcano(stored_runtime(snapshot)):
        found.extend(await bus.snapshots.list(cluster, "PriorityClass", ""))
    return found


def planning_inputs(trainjob: dict[str, Any]) -> str:
    """Digest of what planning reads from the TrainJob itself: its metadata (without
    resourceVersion and managedFields) and spec. A status write leaves it unchanged; the status
    only ever turns planning off (finished, deadline passed), which the status service handles."""
    meta = {k: v for k, v in (trainjob.get("metadata") or {}).items() if k not in ("resourceVersion", "managedFields")}
    text = json.dumps([meta, trainjob.get("spec")], sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def inputs_already_applied(trainjob: dict[str, Any], applied: Any) -> bool:
    """The plan applied (or being applied under a live claim: if that apply fails, the plan
    message itself is retried) for this uid and generation was made from these very inputs: an
    event that changed only the status cannot change the plan (children and runtimes have their
    own events), so it needs no planning pass."""
    meta = trainjob.get("metadata") or {}
    return applied is not None and (applied.state == "applied" or applied.claim_live()) and bool(applied.inputs) \
        and applied.uid == meta.get("uid") and applied.generation == int(meta.get("generation") or 0) \
        and applied.inputs == planning_inputs(trainjob)


@dataclass(frozen=True)
class _Known:
    expires: float  # time.monotonic()
    uid: str
    generation: int
    inputs: str
    suspended: bool
    partition: int


class KnownPlans:
    """What this process knows of each TrainJob's plan, bounded, per partition: the plan it
    published in the last ``published_ttl_s`` seconds (until the applier records it, only the
    planner knows what it was made from), or the plan a read of ``ty_applied`` showed applied
    for the TrainJob as it was then (kept ``applied_ttl_s``).

    Either answers, without a read, the two questions most events ask: whether a TrainJob event
    changed the planning inputs (a status write does not), and whether a child's event can
    change the plan (only a JobSet whose suspension is not the plan's can, or a deletion). A
    newer generation of the TrainJob is not known here, and needs not be: it has an event of its
    own, which is planned. A partition's entries go when the partition goes (another replica
    may plan its TrainJobs meanwhile). A published plan is trusted only briefly: if it fails to
    apply, a later child event plans it again, as without this memory."""

    def __init__(self, published_ttl_s: float = 10.0, applied_ttl_s: float = 300.0, size: int = 16384) -> None:
        self._published_ttl_s = published_ttl_s
        self._applied_ttl_s = applied_ttl_s
        self._size = size
        self._entries: OrderedDict[tuple[str, str], _Known] = OrderedDict()

    def _keep(self, namespace: str, name: str, entry: _Known) -> None:
        key = (namespace, name)
        self._entries[key] = entry
        self._entries.move_to_end(key)
        while len(self._entries) > self._size:
            self._entries.popitem(last=False)

    def published(self, namespace: str, name: str, message: PlanMessage) -> None:
        self._keep(namespace, name, _Known(time.monotonic() + self._published_ttl_s, message.uid, message.generation,
                                           message.inputs, message.suspended, trainjob_partition(namespace, name)))

    def applied(self, trainjob: dict[str, Any], applied: Any) -> None:
        """``applied`` (the ``ty_applied`` record) was read and shows a plan of ``trainjob``'s uid
        and generation applied (its inputs are kept as the record says: ``holds`` compares them
        with each event's, so they are not digested again here)."""
        meta = trainjob.get("metadata") or {}
        if applied is None or applied.state != "applied" or applied.uid != meta.get("uid") \
                or applied.generation != int(meta.get("generation") or 0):
            return
        namespace, name = meta.get("namespace") or "", meta.get("name") or ""
        self._keep(namespace, name, _Known(time.monotonic() + self._applied_ttl_s, applied.uid, applied.generation,
                                           applied.inputs, (trainjob.get("spec") or {}).get("suspend") is True,
                                           trainjob_partition(namespace, name)))

    def _entry(self, namespace: str, name: str) -> _Known | None:
        entry = self._entries.get((namespace, name))
        if entry is not None and entry.expires < time.monotonic():
            del self._entries[(namespace, name)]
            return None
        return entry

    def holds(self, namespace: str, name: str, trainjob: dict[str, Any]) -> bool:
        """Whether ``trainjob`` (an event's copy) has the planning inputs of the known plan."""
        entry = self._entry(namespace, name)
        if entry is None:
            return False
        meta = trainjob.get("metadata") or {}
        return bool(entry.inputs) and entry.uid == meta.get("uid") and entry.generation == int(
            meta.get("generation") or 0) and entry.inputs == planning_inputs(trainjob)

    def child_changes_nothing(self, event: ObjectEvent) -> bool:
        """An ADDED/MODIFIED event of a child of a TrainJob whose plan is known: as
        :func:`child_event_changes_nothing`, told from memory."""
        if event.kind == "TrainJob" or event.type == "DELETED" or event.kind.endswith("Runtime"):
            return False
        owner = owner_reference(event.object)
        if owner is None or not owner.get("name"):
            return False
        entry = self._entry(event.namespace, owner["name"])
        if entry is None or entry.uid != owner.get("uid"):
            return False
        if event.kind == "JobSet":
            return ((event.object.get("spec") or {}).get("suspend") is True) == entry.suspended
        return True

    def forget(self, namespace: str, name: str) -> None:
        self._entries.pop((namespace, name), None)

    def forget_partition(self, partition: int) -> None:
        for key in [key for key, entry in self._entries.items() if entry.partition == partition]:
            del self._entries[key]


class PlannerMemory:
    """What one planner process remembers between events, so that most events need no read:
    the runtime generations it planned for, the plans it knows applied or just published, and
    the TrainJobs with no planning failure recorded. One per ``Planner``; a partition's part is
    forgotten when the partition goes to another replica."""

    def __init__(self) -> None:
        self.known_plans = KnownPlans()
        self._runtime_generations: dict[tuple[str, str, str, str], tuple[str, int]] = {}
        # Per partition: the TrainJobs known to have no planning failure recorded in
        # ``ty_outcomes`` (only this TrainJob's home replica writes one), so a successful pass
        # does not read the bucket to clear nothing.
        self._no_plan_failure: dict[int, set[str]] = {}

    def runtime_spec_changed(self, event: ObjectEvent) -> bool:
        """Whether this runtime event carries a spec generation this process has not planned for."""
        key = (event.cluster, event.kind, event.namespace, event.name)
        seen = self._runtime_generations.get(key)
        self._runtime_generations[key] = (event.uid, event.generation)
        return seen != (event.uid, event.generation)

    def forget_partition(self, partition: int) -> None:
        self._no_plan_failure.pop(partition, None)
        self.known_plans.forget_partition(partition)

    def plan_failure_recorded(self, namespace: str, name: str, key: str) -> None:
        self._no_plan_failure.get(trainjob_partition(namespace, name), set()).discard(key)

    async def clear_plan_failure(self, bus: BusSession, namespace: str, name: str, key: str) -> None:
        known = self._no_plan_failure.setdefault(trainjob_partition(namespace, name), set())
        if key in known:
            return
        await bus.outcomes.clear(key, "plan")
        known.add(key)


def _same_refs(a: list[ObjectRef], b: list[ObjectRef]) -> bool:
    return {(r.api_version, r.kind, r.namespace, r.name) for r in a} == \
        {(r.api_version, r.kind, r.namespace, r.name) for r in b}


def _owned_by(child: dict[str, Any], uid: str | None) -> bool:
    refs = (child.get("metadata") or {}).get("ownerReferences") or []
    return not refs or any(ref.get("uid") == uid for ref in refs)


def is_child(obj: dict[str, Any], trainjob_name: str) -> bool:
    meta = obj.get("metadata") or {}
    return any(
        obj.get("apiVersion") == child.api_version and obj.get("kind") == child.kind
        and meta.get("name") == child.name_for(trainjob_name)
        for child in CHILD_KINDS
    )


def owned_refs(trainjob: dict[str, Any], observed: list[dict[str, Any]],
               plugins: tuple[Plugin, ...] = REGISTRY, compat: TrainerCompat = DEFAULT_COMPAT) -> list[ObjectRef]:
    """Every object the TrainJob should own now, including the ones upstream leaves untouched
    because they exist (a running JobSet): planned as if none of its children existed."""
    name = trainjob["metadata"]["name"]
    without_children = [o for o in observed if not is_child(o, name)]
    full = plan(trainjob, None, without_children, new_ssh_key=deferred_ssh_key,
                new_curve_key=deferred_curve_key, plugins=plugins, compat=compat)
    return [ObjectRef.of(o) for o in full.objects]


def owned_refs_for(trainjob: dict[str, Any], observed: list[dict[str, Any]],
                   planned: list[dict[str, Any]], plugins: tuple[Plugin, ...] = REGISTRY,
                   compat: TrainerCompat = DEFAULT_COMPAT) -> list[ObjectRef]:
    """:func:`owned_refs`, without a second planning pass when no child exists yet (then the
    plan itself lists everything)."""
    name = trainjob["metadata"]["name"]
    if not any(is_child(o, name) for o in observed):
        return [ObjectRef.of(o) for o in planned]
    return owned_refs(trainjob, observed, plugins, compat)


@dataclass(frozen=True)
class PlanDecision:
    """What one planning pass decided for a TrainJob."""

    message: PlanMessage | None = None
    failure: ApplyResult | None = None
    skipped: str = ""


_UNREAD = object()


@dataclass(frozen=True)
class Planned:
    """A TrainJob's plan before it is compared with the applied one."""

    objects: list[dict[str, Any]]
    owned: list[ObjectRef]
    digest: str


def skip_reason(trainjob: dict[str, Any]) -> str | None:
    """Why the TrainJob is not planned at all, before anything is read; None: plan it."""
    if trainjob["metadata"].get("deletionTimestamp"):
        return "being deleted"
    if not managed_by_trainer(trainjob):
        return "managed by another controller"
    if is_finished(trainjob):
        # Never planned again: a deleted JobSet must not come back and re-run the training
        # (kubeflow/trainer#3779), whatever changes on the TrainJob afterwards.
        return "finished"
    return None


def plan_or_fail(cluster: str, trainjob: dict[str, Any], observed: list[dict[str, Any]], now: datetime,
                 plugins: tuple[Plugin, ...] = REGISTRY,
                 compat: TrainerCompat = DEFAULT_COMPAT) -> Planned | PlanDecision:
    """The plan of a TrainJob from what was observed (pure): the objects and the owned refs, or
    the decision not to plan (deadline exceeded) or the planning failure to report."""
    meta = trainjob["metadata"]
    jobset = next((o for o in observed if o.get("kind") == "JobSet"), None)
    if deadline_exceeded(trainjob, jobset, now):
        # The status service fails it and deletes the JobSet; the snapshot may not show it yet.
        return PlanDecision(skipped="deadline exceeded")
    try:
        # No key material in a plan (it is published): the applier generates the MPI SSH keys
        # and the Flux CURVE certificate.
        result = plan(trainjob, None, observed, new_ssh_key=deferred_ssh_key,
                      new_curve_key=deferred_curve_key, plugins=plugins, compat=compat)
        objects = defer_generated_secrets(list(result.objects))
        owned = owned_refs_for(trainjob, observed, objects, plugins, compat)
    except PlanningError as err:
        return PlanDecision(failure=ApplyResult(
            cluster=cluster, namespace=meta.get("namespace") or "", name=meta["name"], uid=meta.get("uid", ""),
            generation=int(meta.get("generation") or 0), outcome="plan-failed",
            reason=err.reason or REASON_CREATION_FAILED, message=err.message,
        ))
    return Planned(objects, owned, plan_hash(objects))


def publish_decision(cluster: str, trainjob: dict[str, Any], planned: Planned, applied: Any) -> PlanDecision:
    """Whether a plan is published (pure): not when the applied plan of this generation is the
    same, or when there is nothing to apply and nothing to delete."""
    meta = trainjob["metadata"]
    uid, generation = meta.get("uid", ""), int(meta.get("generation") or 0)
    if applied is not None and applied.uid == uid and applied.state == "applied" \
            and applied.generation >= generation:
        if applied.plan_hash == planned.digest or planned.digest in applied.hashes:
            return PlanDecision(skipped="unchanged")
        if not planned.objects and _same_refs(applied.owned, planned.owned):
            # Nothing to apply and nothing to delete: e.g. re-planned because our own JobSet
            # appeared, which upstream then leaves untouched.
            return PlanDecision(skipped="nothing to do")
    return PlanDecision(message=PlanMessage(
        cluster=cluster, namespace=meta.get("namespace") or "", name=meta["name"], uid=uid, generation=generation,
        resourceVersion=str(meta.get("resourceVersion", "")), planHash=planned.digest,
        objects=planned.objects, owned=planned.owned,
        suspended=(trainjob.get("spec") or {}).get("suspend") is True,
        inputs=planning_inputs(trainjob),
    ))


async def decide(bus: BusSession, cluster: str, trainjob: dict[str, Any],
                 plugins: tuple[Plugin, ...] = REGISTRY, *, prefetched: Prefetched | None = None,
                 applied: Any = _UNREAD, compat: TrainerCompat = DEFAULT_COMPAT) -> PlanDecision:
    """The reads around the pure decisions: the observed objects once the TrainJob is to be
    planned, the applied plan once there is a plan. ``plugins``: REGISTRY, plus TrainJobStatus
    when that feature gate is on. ``prefetched`` and ``applied``: what the caller read already
    (the applied plan only serves to skip publishing a plan that changes nothing; a plan
    published anyway is deduplicated by the applier, so a read a few milliseconds old is as good
    as a new one)."""
    skipped = skip_reason(trainjob)
    if skipped is not None:
        return PlanDecision(skipped=skipped)
    observed = await observed_objects(bus, cluster, trainjob, prefetched)
    planned = plan_or_fail(cluster, trainjob, observed, datetime.now(timezone.utc), plugins, compat)
    if isinstance(planned, PlanDecision):
        return planned
    if applied is _UNREAD:
        meta = trainjob["metadata"]
        applied = (await bus.applied.read(applied_store_key(cluster, meta.get("namespace") or "", meta["name"]))).value
    return publish_decision(cluster, trainjob, planned, applied)


async def forget_trainjob(bus: BusSession, cluster: str, event: ObjectEvent, memory: PlannerMemory) -> None:
    """A deleted TrainJob's bookkeeping goes too (its children go by garbage collection)."""
    memory.known_plans.forget(event.namespace, event.name)
    key = applied_store_key(cluster, event.namespace, event.name)
    applied = (await bus.applied.read(key)).value
    if applied is not None and applied.uid == event.uid:
        await bus.applied.delete(key)
    outcome = await bus.outcomes.get(key)
    if outcome is not None and outcome.uid == event.uid:
        await bus.outcomes.clear(key, outcome.stage)


def child_event_changes_nothing(event: ObjectEvent, trainjob: dict[str, Any], applied: Any) -> bool:
    """An ADDED/MODIFIED event of a child, when the TrainJob's current generation is applied,
    can only matter through the child's suspend state (spec §4.6.2): a JobSet whose suspend
    matches the TrainJob's, or any other child, leaves the plan as it is. Deletions always count."""
    if event.kind == "TrainJob" or event.type == "DELETED" or event.kind.endswith("Runtime"):
        return False
    if event.kind == "ConfigMap" and event.name == trainjob["metadata"]["name"] + "-tls-config":
        # TrainJobStatus's CA ConfigMap: planning never reads it, and it is applied before the
        # JobSet, so its ADDED event arrives while that plan is still being applied (re-planning
        # then would re-apply the same plan under the ConfigMap's trace).
        return True
    meta = trainjob["metadata"]
    # A plan of this generation that is applied, or being applied right now: a child's ADDED
    # event then comes from that very apply (the JobSet appears before the applier records the
    # plan as applied), and re-planning would only apply the same plan again under the child's
    # trace, taking the TrainJob change's place as the trace status writes link to.
    settled = applied is not None and (applied.state == "applied" or applied.claim_live())
    if not settled or applied.uid != meta.get("uid") or applied.generation != int(meta.get("generation") or 0):
        return False
    if event.kind == "JobSet":
        want = (trainjob.get("spec") or {}).get("suspend") is True
        return ((event.object.get("spec") or {}).get("suspend") is True) == want
    return True


async def reconcile_trainjob(bus: BusSession, cluster: str, namespace: str, name: str, memory: PlannerMemory,
                             trigger: ObjectEvent | None = None, plugins: tuple[Plugin, ...] = REGISTRY,
                             compat: TrainerCompat = DEFAULT_COMPAT) -> str:
    """One planning pass; returns what happened (for logs and metrics)."""
    known_plans = memory.known_plans
    applied: Any = _UNREAD
    prefetched: Prefetched | None = None
    key = ObjectKey(cluster, "TrainJob", namespace, name)
    if trigger is not None and trigger.kind == "TrainJob" and trigger.type != "DELETED":
        # The event carries the TrainJob: a status-only change (the status service's own
        # writes, mostly) is recognised with one read instead of a whole planning pass, or
        # with none when this process has just published the plan of these very inputs (the
        # status write of a new TrainJob often comes before the applier claims its plan).
        if known_plans.holds(namespace, name, trigger.object):
            metrics.PLANS.labels("inputs_unchanged").inc()
            return "inputs unchanged"
        # The snapshots planning reads, named by the event's copy (the runtime reference is
        # immutable), come in the same batched read as the TrainJob's own; ``observed_objects``
        # uses them only if the snapshot names the very same keys. The applied plan is read
        # beside them: a TrainJob this process knows nothing of is mostly a new one, which
        # needs both (one wake-up for both answers).
        keys = observed_keys(cluster, trigger.object)
        entry, read = await asyncio.gather(bus.applied.read(applied_store_key(cluster, namespace, name)),
                                           bus.snapshots.get_many([key, *keys]))
        applied = entry.value
        if inputs_already_applied(trigger.object, applied):
            known_plans.applied(trigger.object, applied)
            metrics.PLANS.labels("inputs_unchanged").inc()
            return "inputs unchanged"
        trainjob, prefetched = read[0], Prefetched(keys, read[1:])
    else:
        if trigger is not None and known_plans.child_changes_nothing(trigger):
            # Most child events: the JobSet and ConfigMaps the plan just applied, then the
            # JobSet's status changes while it runs.
            metrics.PLANS.labels("child_unchanged").inc()
            return "child unchanged"
        trainjob = await bus.snapshots.get(key)
    if trainjob is None:
        return "gone"
    if trigger is not None and trigger.kind != "TrainJob":
        applied = (await bus.applied.read(applied_store_key(cluster, namespace, name))).value
        if child_event_changes_nothing(trigger, trainjob, applied):
            known_plans.applied(trainjob, applied)
            metrics.PLANS.labels("child_unchanged").inc()
            return "child unchanged"
    decision = await decide(bus, cluster, trainjob, plugins, prefetched=prefetched, applied=applied,
                            compat=compat)
    outcome_key = applied_store_key(cluster, namespace, name)
    if decision.failure is not None:
        failure = decision.failure
        memory.plan_failure_recorded(namespace, name, outcome_key)
        await bus.outcomes.set(outcome_key, Outcome(
            uid=failure.uid, generation=failure.generation, stage="plan",
            reason=failure.reason, message=failure.message))
        await bus.publisher.publish(result_subject(cluster, namespace, name), failure,
                                    failure.msg_id() + ":" + _digest(failure.message))
        metrics.PLANS.labels("failed").inc()
        log.info("planning failed", extra={"trainjob": f"{namespace}/{name}", "error": failure.message})
        return "failed"
    await memory.clear_plan_failure(bus, namespace, name, outcome_key)
    if decision.message is None:
        if decision.skipped == "unchanged" and applied is not _UNREAD:
            known_plans.applied(trainjob, applied)
        metrics.PLANS.labels(decision.skipped.replace(" ", "_")).inc()
        return decision.skipped
    message = decision.message
    await bus.publisher.publish(plan_subject(cluster, namespace, name), message, message.msg_id())
    known_plans.published(namespace, name, message)
    metrics.PLANS.labels("published").inc()
    return "published"


def _digest(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()[:16]
