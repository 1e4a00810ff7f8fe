"""The JobSet and Job controllers: reconcile loops around the pure plans in ``jobsets``/``jobs``."""
from __future__ import annotations

import asyncio
import copy
import logging
import time
from datetime import datetime, timezone
from typing import Any

from trainyard.errortext import describe
from trainyard.kube.client import KubeClient, KubeError
from trainyard.kube.events import record_event
from trainyard.kube.resources import JOBSET

from .informers import JOB, POD, PVC, SERVICE, Informer, Key, WorkQueue, controller_owner, run_workers
from .jobs import TRACKING_FINALIZER, plan_job
from .jobsets import JobSetError, plan_jobset, subdomain, volume_claims

log = logging.getLogger(__name__)
RECENT_S = 30.0


def _delete_body(policy: str, grace: int | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": policy}
    if grace is not None:
        body["gracePeriodSeconds"] = grace
    return body


async def delete_object(client: KubeClient, path: str, policy: str = "Background") -> None:
    try:
        await client.request("DELETE", path, body=_delete_body(policy))
    except KubeError as err:
        if not err.not_found:
            raise


class JobSetController:
    def __init__(self, client: KubeClient, jobsets: Informer, jobs: Informer, services: Informer,
                 elastic: bool = False) -> None:
        self.client = client
        self.elastic = elastic  # the ElasticJobSet feature gate
        self.jobsets = jobsets
        self.jobs = jobs
        self.services = services
        self.queue = WorkQueue()
        jobsets.listeners.append(lambda _e, obj: self.queue.add(_key(obj)))
        jobs.listeners.append(self._on_owned)
        services.listeners.append(self._on_owned)

    def _on_owned(self, event: str, obj: dict[str, Any]) -> None:
        owner = controller_owner(obj, "JobSet")
        if owner:
            self.queue.add(((obj.get("metadata") or {}).get("namespace", ""), owner))

    async def run(self, stop: asyncio.Event) -> None:
        await run_workers("jobset", self.queue, self.reconcile, stop)

    async def reconcile(self, key: Key) -> None:
        namespace, name = key
        jobset = self.jobsets.get(namespace, name)
        if jobset is None:
            return
        jobs = self.jobs.items(namespace)
        service_exists = self.services.get(namespace, subdomain(jobset)) is not None
        try:
            plan = plan_jobset(jobset, jobs, service_exists, datetime.now(timezone.utc), self.elastic)
        except JobSetError as err:
            log.error("jobset %s/%s: %s", namespace, name, describe(err))
            self.queue.add_after(key, 5.0)
            return
        errors: list[str] = []
        if plan.create_service is not None or plan.create_jobs:
            # The cache may not show a deletion yet; creating children for a JobSet that is
            # being deleted would hold its foreground deletion open.
            fresh = await self.client.get(JOBSET, namespace, name)
            if fresh is None or fresh["metadata"].get("deletionTimestamp") or \
                    fresh["metadata"].get("uid") != jobset["metadata"].get("uid"):
                return
        if plan.create_jobs:
            errors.extend(await self._ensure_claims(jobset))
        if plan.create_service is not None:
            try:
                created = await self.client.create(SERVICE, namespace, plan.create_service)
                self.services.store(created)
            except KubeError as err:
                if err.status != 409:
                    await record_event(self.client, jobset, "Warning", "HeadlessServiceCreationFailed",
                                       err.message, "jobset")
                    errors.append(err.message)
        for job_name in plan.delete_jobs:
            await delete_object(self.client, JOB.path(namespace, job_name), "Foreground")
        if plan.create_jobs:
            log.info("jobset %s/%s: creating jobs %s", namespace, name,
                     [job["metadata"]["name"] for job in plan.create_jobs])
        created_jobs = await asyncio.gather(*(self._create_job(jobset, job) for job in plan.create_jobs))
        errors.extend(err for err in created_jobs if err)
        for job_name, parallelism, completions in plan.scale_jobs:
            log.info("jobset %s/%s: resizing job %s to parallelism=completions=%s", namespace, name, job_name,
                     parallelism)
            await self._patch_job(namespace, job_name, {"spec": {"parallelism": parallelism,
                                                                 "completions": completions}})
        for job_name in plan.suspend_jobs:
            await self._patch_job(namespace, job_name, {"spec": {"suspend": True}})
        for job_name, template_patch, clear_start in plan.resume_jobs:
            if clear_start:
                current = self.jobs.get(namespace, job_name)
                if current is not None:
                    body = copy.deepcopy(current)
                    body.setdefault("status", {}).pop("startTime", None)
                    self.jobs.store(await self.client.request(
                        "PUT", JOB.path(namespace, job_name, "status"), body=body))
            await self._patch_job(namespace, job_name, {"spec": {"suspend": False,
                                                                 "template": template_patch}})
        if plan.status is not None:
            body = copy.deepcopy(jobset)
            body["status"] = plan.status
            updated = await self.client.request("PUT", JOBSET.path(namespace, name, "status"), body=body)
            self.jobsets.store(updated)
            log.info("jobset %s/%s: status %s", namespace, name,
                     [(c["type"], c["status"]) for c in plan.status.get("conditions") or []])
            for event_type, reason, message in plan.events:
                await record_event(self.client, updated, event_type, reason, message, "jobset")
        elif plan.events:
            for event_type, reason, message in plan.events:
                await record_event(self.client, jobset, event_type, reason, message, "jobset")
        if plan.delete_self:
            await delete_object(self.client, JOBSET.path(namespace, name), "Foreground")
        if plan.requeue_after is not None:
            self.queue.add_after(key, plan.requeue_after)
        if errors:
            raise KubeError(0, "JobCreationFailed", "; ".join(errors))

    async def _ensure_claims(self, jobset: dict[str, Any]) -> list[str]:
        """Create the PVCs of ``volumeClaimPolicies`` that do not exist yet (before the Jobs
        whose pods mount them); one that exists already is kept as it is."""
        errors = []
        for claim in volume_claims(jobset):
            try:
                await self.client.create(PVC, claim["metadata"]["namespace"], claim)
            except KubeError as err:
                if err.status != 409:
                    errors.append(f"failed to create PVC {claim['metadata']['name']}: {err.message}")
        return errors

    async def _create_job(self, jobset: dict[str, Any], job: dict[str, Any]) -> str | None:
        namespace = job["metadata"]["namespace"]
        spec = job.get("spec") or {}
        # (completions defaults to 1 only when parallelism is unset too)
        if spec.get("completionMode", "NonIndexed") == "Indexed" and spec.get("completions") is None \
                and spec.get("parallelism") is not None:
            # batch/v1 validation the devcluster API server does not do: answer as it would.
            message = (f'Job.batch "{job["metadata"]["name"]}" is invalid: spec.completions: '
                       "Required value: when completion mode is Indexed")
            await record_event(self.client, jobset, "Warning", "JobCreationFailed", message, "jobset")
            return message
        try:
            self.jobs.store(await self.client.create(JOB, namespace, job))
        except KubeError as err:
            if err.status == 409:
                return None
            await record_event(self.client, jobset, "Warning", "JobCreationFailed", err.message, "jobset")
            return err.message
        return None

    async def _patch_job(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        try:
            self.jobs.store(await self.client.merge_patch(JOB, namespace, name, patch))
        except KubeError as err:
            if not err.not_found:
                raise


class JobController:
    def __init__(self, client: KubeClient, jobs: Informer, pods: Informer, time_scale: float) -> None:
        self.client = client
        self.jobs = jobs
        self.pods = pods
        self.time_scale = time_scale
        self.queue = WorkQueue()
        # Pods this controller created or deleted that the watch has not shown yet: planning
        # from a lagging cache must not create a second pod for the same index.
        self._created: dict[Key, dict[str, tuple[float, dict[str, Any]]]] = {}
        self._deleted: dict[Key, dict[str, float]] = {}
        jobs.listeners.append(lambda _e, obj: self.queue.add(_key(obj)))
        pods.listeners.append(self._on_pod)

    def _on_pod(self, event: str, obj: dict[str, Any]) -> None:
        owner = controller_owner(obj, "Job")
        if owner:
            self.queue.add(((obj.get("metadata") or {}).get("namespace", ""), owner))

    async def run(self, stop: asyncio.Event) -> None:
        await run_workers("job", self.queue, self.reconcile, stop)

    def _pods_of(self, job: dict[str, Any], key: Key) -> list[dict[str, Any]]:
        uid = job["metadata"].get("uid")
        now = time.monotonic()
        observed = [p for p in self.pods.items(key[0])
                    if any(ref.get("uid") == uid and ref.get("controller")
                           for ref in (p.get("metadata") or {}).get("ownerReferences") or [])]
        names = {p["metadata"]["name"] for p in observed}
        created = self._created.setdefault(key, {})
        for name, (when, _) in list(created.items()):
            if name in names or now - when > RECENT_S:
                created.pop(name)
        deleted = self._deleted.setdefault(key, {})
        for name, when in list(deleted.items()):
            if name not in names or now - when > RECENT_S:
                deleted.pop(name)
        pods = []
        for pod in observed:
            name = pod["metadata"]["name"]
            if name in deleted and not pod["metadata"].get("deletionTimestamp"):
                pod = copy.deepcopy(pod)
                pod["metadata"]["deletionTimestamp"] = "pending"
            pods.append(pod)
        pods.extend(obj for _, obj in created.values())
        return pods

    async def reconcile(self, key: Key) -> None:
        namespace, name = key
        job = self.jobs.get(namespace, name)
        if job is None:
            await self._release_orphans(namespace, name)
            return
        pods = self._pods_of(job, key)
        if job["metadata"].get("deletionTimestamp"):
            # Being deleted: let its pods go once they have stopped. A pod on the node keeps
            # its finalizer until the kubelet reports it terminal, so the Job (and a JobSet
            # restart waiting for the name) outlives the processes, as graceful deletion does.
            for pod in pods:
                if TRACKING_FINALIZER in (pod["metadata"].get("finalizers") or []) and (
                        (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed") or
                        (pod["metadata"].get("deletionTimestamp") and not (pod.get("spec") or {}).get("nodeName"))):
                    await self._drop_finalizer(pod)
            return
        plan = plan_job(job, pods, datetime.now(timezone.utc), self.time_scale)
        by_name = {p["metadata"]["name"]: p for p in pods}
        for pod_name in plan.delete_untracked:
            if pod_name in by_name:
                await self._drop_finalizer(by_name[pod_name])
            await self._delete_pod(key, pod_name)
        if plan.status != (job.get("status") or {}):
            body = copy.deepcopy(job)
            body["status"] = plan.status
            self.jobs.store(await self.client.request("PUT", JOB.path(namespace, name, "status"), body=body))
        for pod_name in plan.remove_finalizer:
            if pod_name in by_name:
                await self._drop_finalizer(by_name[pod_name])
        for pod_name in plan.delete:
            await self._delete_pod(key, pod_name)
        if plan.create:
            fresh = await self.client.get(JOB, namespace, name)
            if fresh is None or fresh["metadata"].get("deletionTimestamp") or \
                    fresh["metadata"].get("uid") != job["metadata"].get("uid"):
                plan.create = []  # being deleted: replacements would hold the deletion open
        for pod in plan.create:
            created = await self.client.create(POD, namespace, pod)
            log.info("job %s/%s: created pod %s", namespace, name, created["metadata"]["name"])
            self._created.setdefault(key, {})[created["metadata"]["name"]] = (time.monotonic(), created)
        for event_type, reason, message in plan.events:
            await record_event(self.client, job, event_type, reason, message, "job-controller")
        if plan.delete_self:
            await delete_object(self.client, JOB.path(namespace, name), "Background")
        if plan.requeue_after is not None:
            self.queue.add_after(key, max(plan.requeue_after, 0.05))

    async def _delete_pod(self, key: Key, pod_name: str) -> None:
        self._deleted.setdefault(key, {})[pod_name] = time.monotonic()
        await delete_object(self.client, POD.path(key[0], pod_name))

    async def _drop_finalizer(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        if not meta.get("uid"):
            return
        # Only this controller manages the tracking finalizer, so no resourceVersion guard:
        # the kubelet's frequent status writes would otherwise turn every removal into a 409.
        finalizers = [f for f in meta.get("finalizers") or [] if f != TRACKING_FINALIZER]
        patch = {"metadata": {"finalizers": finalizers or None}}
        try:
            updated = await self.client.merge_patch(POD, meta.get("namespace"), meta["name"], patch)
            self.pods.store(updated)
        except KubeError as err:
            if not err.not_found:
                raise

    async def _release_orphans(self, namespace: str, job_name: str) -> None:
        """Pods whose Job is gone lose their tracking finalizer so they can disappear."""
        for pod in self.pods.items(namespace):
            if controller_owner(pod, "Job") == job_name and \
                    TRACKING_FINALIZER in (pod["metadata"].get("finalizers") or []):
                await self._drop_finalizer(pod)


def _key(obj: dict[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return meta.get("namespace", ""), meta.get("name", "")
