"""applier: plans -> server-side apply (field manager ``trainer``, forced) + deletions.

Monotonic per TrainJob whatever the number of appliers: before touching the cluster an applier
claims the TrainJob's entry in the ``ty_applied`` bucket with compare-and-set. A plan whose
generation is older than the entry's is dropped; while another applier holds a live claim this
one waits for it. The claim is released with the result (or expires after the lease, when its
holder died).
"""
from __future__ import annotations

import logging
import time
import uuid
from copy import deepcopy
from dataclasses import dataclass, field
from typing import Any

from trainyard.bus.consumer import Delivery, PermanentError, decoding
from trainyard.bus.envelopes import ApplyResult, ObjectRef, PlanMessage
from trainyard.bus.claims import Claim, ClaimLost, ClaimProtocol, Wanted, remembered_hashes
from trainyard.bus.kv import AppliedPlan, Outcome, applied_key
from trainyard.bus.session import BusSession
from trainyard.bus.partitions import PartitionedSubscriber, Subscription
from trainyard.bus.subjects import (ObjectKey, PLANS_PREFIX, partition_filter, partitions_setting, result_subject,
                                    trainjob_partition)
from trainyard.bus.topology import PLANS_STREAM
from trainyard.kube import resources as r
from trainyard.kube.client import FIELD_MANAGER, KubeClient, KubeError
from trainyard.kube.resources import resource_for
from trainyard.pipeline.ssh_keys import materialize, needs_generation
from trainyard.pipeline.trainjobs import (REASON_CREATION_FAILED, creation_failed_message, managed_by_trainer,
                                          owned_by_uid)
from trainyard.telemetry import metrics
from trainyard.telemetry.tracing import current_traceparent

log = logging.getLogger(__name__)

ROLE = "applier"


@dataclass
class Applier:
    bus: BusSession
    kube: KubeClient
    cluster: str
    lease_s: float = 30.0
    ack_wait_s: float = 60.0
    holder: str = field(default_factory=lambda: f"applier-{uuid.uuid4().hex[:8]}")
    partitions: int = field(default_factory=partitions_setting)

    def __post_init__(self) -> None:
        self.claims = ClaimProtocol(self.bus.applied, self.holder, self.lease_s)

    @property
    def request_timeout_s(self) -> float:
        """A request never outlives the claim: it starts at most a third of the lease after a
        renewal and gives up after another third."""
        return self.lease_s / 3

    def subscriptions(self) -> list[Subscription]:
        cluster = self.cluster
        # A newer plan queued behind an older one of the same TrainJob makes it redundant.
        return [Subscription(PLANS_STREAM, ROLE, lambda p: [partition_filter(PLANS_PREFIX, cluster, p)],
                             decoding(PlanMessage, self.handle), ack_wait_s=self.ack_wait_s, max_deliver=8, coalesce=True)]

    def subscriber(self) -> PartitionedSubscriber:
        return PartitionedSubscriber(self.bus, ROLE, self.cluster, self.subscriptions(), service="applier",
                                     partitions=self.partitions, on_release=self.claims.forget_partition)

    async def handle(self, plan: PlanMessage, delivery: Delivery) -> None:
        started = time.perf_counter()
        outcome = await self.apply_plan(plan)
        metrics.APPLIES.labels(outcome).inc()
        metrics.APPLY_DURATION.observe(time.perf_counter() - started)

    async def apply_plan(self, plan: PlanMessage) -> str:
        # The JobSet's snapshot (whether its suspension flips) comes in the same batched read
        # as the TrainJob's.
        keys = [ObjectKey(self.cluster, "TrainJob", plan.namespace, plan.name),
                *(ObjectKey(self.cluster, "JobSet", obj["metadata"]["namespace"], obj["metadata"]["name"])
                  for obj in plan.objects if obj.get("kind") == "JobSet")]
        read = await self.bus.snapshots.get_many(keys)
        trainjob = read[0]
        jobsets = {(key.namespace, key.name): obj for key, obj in zip(keys[1:], read[1:])}
        if trainjob is None or trainjob["metadata"].get("uid") != plan.uid:
            return await self._report(plan, "skipped-stale", message="TrainJob is gone")
        if not managed_by_trainer(trainjob):
            return await self._report(plan, "skipped-stale", message="managed by another controller")
        key = applied_key(self.cluster, plan.namespace, plan.name)
        partition = trainjob_partition(plan.namespace, plan.name, self.partitions)
        claim = await self.claims.claim(key, _wanted(plan), partition)
        if isinstance(claim, str):
            return await self._report(plan, claim)
        try:
            applied, deleted = await self._apply_objects(plan, claim, key, partition, jobsets)
        except ClaimLost:
            log.warning("claim on %s/%s taken over during apply; stopped", plan.namespace, plan.name)
            return await self._report(plan, "skipped-stale", message="claim taken over by another applier")
        except KubeError as err:
            await self.claims.release(key, claim, partition)
            if err.transient:
                raise
            message = creation_failed_message(str(err.message or err))
            await self.bus.outcomes.set(key, Outcome(uid=plan.uid, generation=plan.generation, stage="apply",
                                                     reason=REASON_CREATION_FAILED, message=message))
            await self._report(plan, "failed", reason=REASON_CREATION_FAILED, message=message)
            raise PermanentError(f"apply of {plan.namespace}/{plan.name} failed: {err}") from None
        except BaseException:
            await self.claims.release(key, claim, partition)
            raise
        done = AppliedPlan(
            uid=plan.uid, generation=plan.generation, planHash=plan.plan_hash, state="applied",
            owned=list(plan.owned), hashes=remembered_hashes(claim.previous, _wanted(plan)),
            traceparent=current_traceparent(), inputs=plan.inputs,
        )
        if not await self.claims.finish(key, claim, done, partition):
            log.warning("claim on %s/%s expired during apply", plan.namespace, plan.name)
            return await self._report(plan, "skipped-stale", applied=applied, deleted=deleted,
                                      message="claim expired during apply")
        await self.bus.outcomes.clear(key, "apply")
        return await self._report(plan, "applied", applied=applied, deleted=deleted)

    async def _apply_objects(self, plan: PlanMessage, claim: Claim, key: str, partition: int,
                             jobsets: dict[tuple[str, str], dict[str, Any] | None]
                             ) -> tuple[list[ObjectRef], list[ObjectRef]]:
        """``jobsets``: the snapshots of the plan's JobSets, read with the TrainJob's."""
        previous = claim.previous
        applied: list[ObjectRef] = []
        for obj in plan.objects:
            await self.claims.renew(key, claim, partition)
            obj = with_owner(obj, plan)
            if await self._apply_one(obj, jobsets):
                applied.append(ObjectRef.of(obj))
        wanted = {_ref_key(ref) for ref in plan.owned}
        deleted: list[ObjectRef] = []
        for ref in (previous.owned if previous else []):
            await self.claims.renew(key, claim, partition)
            if _ref_key(ref) not in wanted and await self._delete_owned(ref, plan.uid):
                deleted.append(ref)
        return applied, deleted

    async def _apply_one(self, obj: dict[str, Any], jobsets: dict[tuple[str, str], dict[str, Any] | None]) -> bool:
        meta = obj["metadata"]
        resource = resource_for(obj["apiVersion"], obj["kind"])
        if obj["kind"] == "Secret" and (obj.get("immutable") is True or needs_generation(obj)):
            # Created once, never updated (the MPI SSH keys, spec §5.3; the Flux CURVE
            # certificate, whose key the running brokers hold).
            if await self.kube.get(resource, meta.get("namespace"), meta["name"],
                                   timeout_s=self.request_timeout_s) is not None:
                return False
        if needs_generation(obj):
            # The plan names the Secret without its data (no key material on the bus): the key
            # pair is made here, in memory, and goes only to the API server.
            try:
                obj = materialize(obj)
            except ValueError as err:
                raise PermanentError(str(err)) from None
        if obj["kind"] == "JobSet":
            await self._apply_jobset(obj, jobsets)
            return True
        await self.kube.apply(obj, timeout_s=self.request_timeout_s)
        return True

    async def _apply_jobset(self, desired: dict[str, Any],
                            snapshots: dict[tuple[str, str], dict[str, Any] | None]) -> None:
        """SSA of the JobSet, with suspend flipped on its own (kubeflow/trainer#3008).

        A JobSet accepts template changes only while it is suspended, and upstream's single
        apply of the whole object on resume trips over that. Here the full object is applied
        while the JobSet is suspended and ``spec.suspend`` is changed by a separate patch: on
        resume, apply (still suspended) then unsuspend; on suspend, suspend then apply.
        """
        meta = desired["metadata"]
        want_suspended = (desired.get("spec") or {}).get("suspend") is True
        # The snapshot saves a GET in the common case (a new JobSet, or no suspend change);
        # a suspend flip is confirmed against the live object.
        at = (meta["namespace"], meta["name"])
        current = snapshots[at] if at in snapshots else \
            await self.bus.snapshots.get(ObjectKey(self.cluster, "JobSet", *at))
        if current is not None and ((current.get("spec") or {}).get("suspend") is True) != want_suspended:
            current = await self.kube.get(r.JOBSET, meta["namespace"], meta["name"],
                                          timeout_s=self.request_timeout_s)
        is_suspended = current is not None and (current.get("spec") or {}).get("suspend") is True
        timeout = self.request_timeout_s
        if current is None or want_suspended == is_suspended:
            await self.kube.apply(desired, timeout_s=timeout)
            return
        if want_suspended:
            await self._patch_suspend(meta, True)
            await self.kube.apply(desired, timeout_s=timeout)
            return
        still_suspended = deepcopy(desired)
        still_suspended["spec"]["suspend"] = True
        await self.kube.apply(still_suspended, timeout_s=timeout)
        await self._patch_suspend(meta, False)

    async def _patch_suspend(self, meta: dict[str, Any], suspend: bool) -> None:
        await self.kube.request(
            "PATCH", r.JOBSET.path(meta["namespace"], meta["name"]),
            query={"fieldManager": FIELD_MANAGER}, body={"spec": {"suspend": suspend}},
            content_type="application/merge-patch+json", timeout_s=self.request_timeout_s,
        )

    async def _delete_owned(self, ref: ObjectRef, uid: str) -> bool:
        """Deletes an object no longer planned, only if this TrainJob controls it."""
        resource = resource_for(ref.api_version, ref.kind)
        current = await self.kube.get(resource, ref.namespace or None, ref.name,
                                      timeout_s=self.request_timeout_s)
        if current is None:
            return False
        if not owned_by_uid(current, uid):
            return False
        return await self.kube.delete(resource, ref.namespace or None, ref.name,
                                      timeout_s=self.request_timeout_s)

    async def _report(self, plan: PlanMessage, outcome: str, *, reason: str = "", message: str = "",
                      applied: list[ObjectRef] | None = None, deleted: list[ObjectRef] | None = None) -> str:
        result = ApplyResult(
            cluster=plan.cluster, namespace=plan.namespace, name=plan.name, uid=plan.uid,
            generation=plan.generation, planHash=plan.plan_hash, outcome=outcome,  # type: ignore[arg-type]
            applied=applied or [], deleted=deleted or [], reason=reason, message=message,
            applier=self.holder,
        )
        # One result per handling (not deduplicated): the stream is the record of what was applied.
        await self.bus.publisher.publish(result_subject(plan.cluster, plan.namespace, plan.name,
                                                        trainjob_partition(plan.namespace, plan.name, self.partitions)), result,
                                         f"{result.msg_id()}:{self.holder}:{uuid.uuid4().hex[:8]}")
        log.info("plan handled", extra={"trainjob": f"{plan.namespace}/{plan.name}", "outcome": outcome,
                                        "generation": plan.generation})
        return outcome


def _wanted(plan: PlanMessage) -> Wanted:
    return Wanted(plan.uid, plan.generation, plan.plan_hash, plan.inputs)


def with_owner(obj: dict[str, Any], plan: PlanMessage) -> dict[str, Any]:
    """Makes sure the object carries the controller reference to its TrainJob."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    if any(ref.get("uid") == plan.uid for ref in refs):
        return obj
    obj = deepcopy(obj)
    obj["metadata"].setdefault("ownerReferences", []).append({
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": plan.name,
        "uid": plan.uid, "controller": True, "blockOwnerDeletion": True,
    })
    return obj


def _ref_key(ref: ObjectRef) -> tuple[str, str, str, str]:
    return ref.api_version, ref.kind, ref.namespace, ref.name
