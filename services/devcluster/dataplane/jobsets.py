"""The JobSet controller's decisions for one JobSet (pure), per JOBSET-DATAPLANE.md §2-§3.

``plan_jobset(jobset, jobs, service_exists, now)`` returns the child Jobs to create, delete
(foreground), suspend or resume, the headless Service to create, the new ``status`` (only
when it changed) and the events to emit after that status write succeeded.
"""
from __future__ import annotations

import copy
import hashlib
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from .jobs import format_time, is_true, parse_time

GROUP_VERSION = "jobset.x-k8s.io/v1alpha2"
CONTROLLER_NAME = "jobset.sigs.k8s.io/jobset-controller"
PREFIX = "jobset.sigs.k8s.io/"
LABEL_JOBSET_NAME = PREFIX + "jobset-name"
LABEL_JOBSET_UID = PREFIX + "jobset-uid"
LABEL_RJOB_NAME = PREFIX + "replicatedjob-name"
LABEL_RESTART_ATTEMPT = PREFIX + "restart-attempt"
LABEL_RJOB_REPLICAS = PREFIX + "replicatedjob-replicas"
LABEL_GLOBAL_REPLICAS = PREFIX + "global-replicas"
LABEL_JOB_INDEX = PREFIX + "job-index"
LABEL_JOB_KEY = PREFIX + "job-key"
LABEL_JOB_GLOBAL_INDEX = PREFIX + "job-global-index"
LABEL_GROUP_NAME = PREFIX + "group-name"
LABEL_GROUP_REPLICAS = PREFIX + "group-replicas"
LABEL_JOB_GROUP_INDEX = PREFIX + "job-group-index"
LABEL_COORDINATOR = PREFIX + "coordinator"
EXCLUSIVE_KEYS = ("alpha.jobset.sigs.k8s.io/exclusive-topology", "alpha.jobset.sigs.k8s.io/node-selector")

JOB_FAILURE_REASONS = ("BackoffLimitExceeded", "DeadlineExceeded", "FailedIndexes",
                       "MaxFailedIndexesExceeded", "PodFailurePolicy")
MUTUALLY_EXCLUSIVE = {"StartupPolicyInProgress": "StartupPolicyCompleted",
                      "StartupPolicyCompleted": "StartupPolicyInProgress"}
NORMAL_EVENT_TYPES = {"Completed", "Suspended", "StartupPolicyInProgress", "StartupPolicyCompleted"}


class JobSetError(Exception):
    """The reconcile cannot proceed (retried), e.g. a child Job with a bad restart label."""


@dataclass
class JobSetPlan:
    create_jobs: list[dict[str, Any]] = field(default_factory=list)
    delete_jobs: list[str] = field(default_factory=list)
    suspend_jobs: list[str] = field(default_factory=list)
    resume_jobs: list[tuple[str, dict[str, Any], bool]] = field(default_factory=list)  # name, template patch, clear startTime
    scale_jobs: list[tuple[str, int | None, int | None]] = field(default_factory=list)  # name, parallelism, completions
    create_service: dict[str, Any] | None = None
    status: dict[str, Any] | None = None
    events: list[tuple[str, str, str]] = field(default_factory=list)
    requeue_after: float | None = None
    delete_self: bool = False


# -- names and labels ---------------------------------------------------------------------
def subdomain(jobset: dict[str, Any]) -> str:
    network = (jobset.get("spec") or {}).get("network") or {}
    return network.get("subdomain") or jobset["metadata"]["name"]


def dns_enabled(jobset: dict[str, Any]) -> bool:
    network = (jobset.get("spec") or {}).get("network")
    if network is None:
        return True  # the create-time default; see defaulting below
    value = network.get("enableDNSHostnames")
    return True if value is None else bool(value)


def replicas_of(rjob: dict[str, Any]) -> int:
    value = rjob.get("replicas")
    return 1 if value is None else int(value)


def group_of(rjob: dict[str, Any]) -> str:
    return rjob.get("groupName") or "default"


def job_name(jobset_name: str, rjob_name: str, index: int) -> str:
    return f"{jobset_name}-{rjob_name}-{index}"


def job_key(namespace: str, name: str) -> str:
    return hashlib.sha1(f"{namespace}/{name}".encode()).hexdigest()


def jobset_keys(jobset: dict[str, Any], rjob_position: int, index: int, restarts: int) -> dict[str, str]:
    """The labels (and, identically, annotations) JobSet puts on a child Job and its pods."""
    meta = jobset["metadata"]
    rjobs = (jobset.get("spec") or {}).get("replicatedJobs") or []
    rjob = rjobs[rjob_position]
    group = group_of(rjob)
    name = job_name(meta["name"], rjob["name"], index)
    keys = {
        LABEL_JOBSET_NAME: meta["name"],
        LABEL_JOBSET_UID: meta.get("uid", ""),
        LABEL_RJOB_NAME: rjob["name"],
        LABEL_RESTART_ATTEMPT: str(restarts),
        LABEL_RJOB_REPLICAS: str(replicas_of(rjob)),
        LABEL_GLOBAL_REPLICAS: str(sum(replicas_of(r) for r in rjobs)),
        LABEL_JOB_INDEX: str(index),
        LABEL_JOB_KEY: job_key(meta.get("namespace", "default"), name),
        LABEL_JOB_GLOBAL_INDEX: str(sum(replicas_of(r) for r in rjobs[:rjob_position]) + index),
        LABEL_GROUP_NAME: group,
        LABEL_GROUP_REPLICAS: str(sum(replicas_of(r) for r in rjobs if group_of(r) == group)),
        LABEL_JOB_GROUP_INDEX: str(sum(replicas_of(r) for r in rjobs[:rjob_position]
                                       if group_of(r) == group) + index),
    }
    coordinator = (jobset.get("spec") or {}).get("coordinator")
    if coordinator:
        keys[LABEL_COORDINATOR] = (f"{meta['name']}-{coordinator.get('replicatedJob')}-"
                                   f"{coordinator.get('jobIndex') or 0}-{coordinator.get('podIndex') or 0}"
                                   f".{subdomain(jobset)}")
    return keys


def build_job(jobset: dict[str, Any], rjob_position: int, index: int, restarts: int) -> dict[str, Any]:
    meta = jobset["metadata"]
    spec = jobset.get("spec") or {}
    rjob = spec["replicatedJobs"][rjob_position]
    template = copy.deepcopy(rjob.get("template") or {})
    tmeta = template.get("metadata") or {}
    keys = jobset_keys(jobset, rjob_position, index, restarts)
    exclusive = {k: v for k, v in (meta.get("annotations") or {}).items() if k in EXCLUSIVE_KEYS}
    exclusive.update({k: v for k, v in (tmeta.get("annotations") or {}).items() if k in EXCLUSIVE_KEYS})
    job_spec = template.get("spec") or {}
    job_spec.setdefault("completionMode", "Indexed")
    pod_template = job_spec.setdefault("template", {})
    pod_meta = pod_template.setdefault("metadata", {})
    pod_meta["labels"] = {**(pod_meta.get("labels") or {}), **keys}
    pod_meta["annotations"] = {**(pod_meta.get("annotations") or {}), **exclusive, **keys}
    pod_spec = pod_template.setdefault("spec", {})
    pod_spec.setdefault("restartPolicy", "OnFailure")
    if dns_enabled(jobset):
        pod_spec["subdomain"] = subdomain(jobset)
    add_claim_volumes(jobset, pod_spec)
    job_spec["suspend"] = bool(spec.get("suspend"))
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job_name(meta["name"], rjob["name"], index),
            "namespace": meta.get("namespace", "default"),
            "labels": {**(tmeta.get("labels") or {}), **keys},
            "annotations": {**(tmeta.get("annotations") or {}), **exclusive, **keys},
            "ownerReferences": [{"apiVersion": GROUP_VERSION, "kind": "JobSet", "name": meta["name"],
                                 "uid": meta.get("uid", ""), "controller": True,
                                 "blockOwnerDeletion": True}],
        },
        "spec": job_spec,
    }


def claim_name(template_name: str, jobset_name: str) -> str:
    """The PVC a ``volumeClaimPolicies`` template becomes: ``<claim>-<jobset>``, shared by every
    replicated Job."""
    return f"{template_name}-{jobset_name}"


def volume_claims(jobset: dict[str, Any]) -> list[dict[str, Any]]:
    """The PVCs of ``spec.volumeClaimPolicies`` (JobSet v0.12): each template's labels (plus
    the JobSet-name label), annotations and spec; owned by the JobSet (deleted with it) unless
    ``retentionPolicy.whenDeleted`` is ``Retain``."""
    meta = jobset["metadata"]
    claims = []
    for policy in (jobset.get("spec") or {}).get("volumeClaimPolicies") or []:
        retain = ((policy.get("retentionPolicy") or {}).get("whenDeleted") or "Delete") == "Retain"
        for template in policy.get("templates") or []:
            tmeta = template.get("metadata") or {}
            claim_meta: dict[str, Any] = {
                "name": claim_name(tmeta.get("name", ""), meta["name"]),
                "namespace": meta.get("namespace", "default"),
                "labels": {**(tmeta.get("labels") or {}), LABEL_JOBSET_NAME: meta["name"]}}
            if tmeta.get("annotations"):
                claim_meta["annotations"] = dict(tmeta["annotations"])
            if not retain:
                claim_meta["ownerReferences"] = [{
                    "apiVersion": GROUP_VERSION, "kind": "JobSet", "name": meta["name"],
                    "uid": meta.get("uid", ""), "controller": True, "blockOwnerDeletion": True}]
            claims.append({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": claim_meta,
                           "spec": copy.deepcopy(template.get("spec") or {})})
    return claims


def add_claim_volumes(jobset: dict[str, Any], pod_spec: dict[str, Any]) -> None:
    """Give the pod a ``persistentVolumeClaim`` volume for each claim template one of its
    containers (init ones included) mounts by name."""
    mounted = {mount.get("name") for container in (pod_spec.get("initContainers") or []) +
               (pod_spec.get("containers") or []) for mount in container.get("volumeMounts") or []}
    present = {volume.get("name") for volume in pod_spec.get("volumes") or []}
    for policy in (jobset.get("spec") or {}).get("volumeClaimPolicies") or []:
        for template in policy.get("templates") or []:
            name = (template.get("metadata") or {}).get("name", "")
            if name in mounted and name not in present:
                pod_spec.setdefault("volumes", []).append({"name": name, "persistentVolumeClaim": {
                    "claimName": claim_name(name, jobset["metadata"]["name"])}})
                present.add(name)


def build_service(jobset: dict[str, Any]) -> dict[str, Any]:
    meta = jobset["metadata"]
    network = (jobset.get("spec") or {}).get("network") or {}
    publish = network.get("publishNotReadyAddresses")
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": subdomain(jobset),
            "namespace": meta.get("namespace", "default"),
            "ownerReferences": [{"apiVersion": GROUP_VERSION, "kind": "JobSet", "name": meta["name"],
                                 "uid": meta.get("uid", ""), "controller": True,
                                 "blockOwnerDeletion": True}],
        },
        "spec": {"clusterIP": "None", "selector": {LABEL_JOBSET_NAME: meta["name"]},
                 "publishNotReadyAddresses": True if publish is None else bool(publish)},
    }


# -- conditions -------------------------------------------------------------------------
def set_jobset_condition(conditions: list[dict[str, Any]], kind: str, status: str, reason: str,
                         message: str, now: str) -> bool:
    """JobSet set semantics (§3.9); True when something changed."""
    changed = False
    found = next((c for c in conditions if c.get("type") == kind), None)
    if found is not None:
        if found.get("status") != status:
            found.clear()
            found.update({"type": kind, "status": status, "lastTransitionTime": now,
                          "reason": reason, "message": message})
            changed = True
        elif (found.get("reason"), found.get("message")) != (reason, message):
            found["reason"], found["message"] = reason, message
            changed = True
    elif status == "True":
        conditions.append({"type": kind, "status": status, "lastTransitionTime": now,
                           "reason": reason, "message": message})
        changed = True
    if status == "True" and kind in MUTUALLY_EXCLUSIVE:
        partner = next((c for c in conditions if c.get("type") == MUTUALLY_EXCLUSIVE[kind]), None)
        if partner is not None and partner.get("status") == "True":
            partner["status"] = "False"
            changed = True
    return changed


# -- classification and counters -----------------------------------------------------------
def _controller_uid(obj: dict[str, Any]) -> str | None:
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return ref.get("uid")
    return None


def _job_conditions(job: dict[str, Any]) -> list[dict[str, Any]]:
    return (job.get("status") or {}).get("conditions") or []


def _job_finished(job: dict[str, Any]) -> str | None:
    for kind in ("Complete", "Failed"):
        if is_true(_job_conditions(job), kind):
            return kind
    return None


def _job_ready(job: dict[str, Any]) -> bool:
    spec = job.get("spec") or {}
    status = job.get("status") or {}
    parallelism = spec.get("parallelism")
    parallelism = 1 if parallelism is None else int(parallelism)
    completions = spec.get("completions")
    needed = parallelism if completions is None else min(parallelism, int(completions))
    return int(status.get("succeeded") or 0) + int(status.get("ready") or 0) >= needed


def _rjob_of(job: dict[str, Any]) -> str:
    return ((job.get("metadata") or {}).get("labels") or {}).get(LABEL_RJOB_NAME, "")


def _deleting(obj: dict[str, Any]) -> bool:
    return bool((obj.get("metadata") or {}).get("deletionTimestamp"))


@dataclass
class Buckets:
    previous: list[dict[str, Any]] = field(default_factory=list)
    succeeded: list[dict[str, Any]] = field(default_factory=list)
    failed: list[dict[str, Any]] = field(default_factory=list)
    active: list[dict[str, Any]] = field(default_factory=list)

    def current(self) -> list[dict[str, Any]]:
        return self.succeeded + self.failed + self.active


def classify(jobs: list[dict[str, Any]], restarts: int) -> Buckets:
    buckets = Buckets()
    for job in jobs:
        raw = ((job.get("metadata") or {}).get("labels") or {}).get(LABEL_RESTART_ATTEMPT)
        try:
            attempt = int(raw)
        except (TypeError, ValueError) as err:
            raise JobSetError(f"job {job['metadata'].get('name')}: label {LABEL_RESTART_ATTEMPT} "
                              f"is {raw!r}, not an integer") from err
        if attempt < restarts:
            buckets.previous.append(job)
        elif _job_finished(job) == "Complete":
            buckets.succeeded.append(job)
        elif _job_finished(job) == "Failed":
            buckets.failed.append(job)
        else:
            buckets.active.append(job)
    return buckets


def replicated_jobs_status(jobset: dict[str, Any], buckets: Buckets) -> list[dict[str, Any]]:
    counts = {r["name"]: {"name": r["name"], "ready": 0, "succeeded": 0, "failed": 0, "active": 0,
                          "suspended": 0}
              for r in (jobset.get("spec") or {}).get("replicatedJobs") or []}
    for job in buckets.succeeded:
        if _rjob_of(job) in counts:
            counts[_rjob_of(job)]["succeeded"] += 1
    for job in buckets.failed:
        if _rjob_of(job) in counts:
            counts[_rjob_of(job)]["failed"] += 1
    for job in buckets.active:
        entry = counts.get(_rjob_of(job))
        if entry is None:
            continue
        if _job_ready(job):
            entry["ready"] += 1
        if int((job.get("status") or {}).get("active") or 0) > 0:
            entry["active"] += 1
        if (job.get("spec") or {}).get("suspend"):
            entry["suspended"] += 1
    return sorted(counts.values(), key=lambda e: e["name"], reverse=True)


# -- the reconcile ---------------------------------------------------------------------------
def _first_failed(jobs: list[dict[str, Any]]) -> dict[str, Any]:
    def failed_at(job: dict[str, Any]) -> str:
        found = next((c for c in _job_conditions(job) if c.get("type") == "Failed"), {})
        return found.get("lastTransitionTime") or ""
    return min(jobs, key=lambda j: (failed_at(j), j["metadata"]["name"]))


def _rule_matches(rule: dict[str, Any], job: dict[str, Any]) -> bool:
    failed = next((c for c in _job_conditions(job) if c.get("type") == "Failed"), {})
    reasons = rule.get("onJobFailureReasons") or []
    if reasons and failed.get("reason") not in reasons:
        return False
    patterns = rule.get("onJobFailureMessagePatterns") or []
    if patterns:
        hit = False
        for pattern in patterns:
            try:
                if re.search(pattern, failed.get("message") or ""):
                    hit = True
                    break
            except re.error:
                continue
        if not hit:
            return False
    targets = rule.get("targetReplicatedJobs") or []
    return not targets or _rjob_of(job) in targets


def _apply_failure_policy(jobset: dict[str, Any], buckets: Buckets, status: dict[str, Any],
                          plan: JobSetPlan, now: str) -> None:
    conditions = status["conditions"]
    policy = (jobset.get("spec") or {}).get("failurePolicy")
    first = _first_failed(buckets.failed)
    if policy is None:
        _fail(status, plan, "FailedJobs", "jobset failed due to one or more job failures "
              f"(first failed job: {first['metadata']['name']})", now)
        return
    action, rule_name, target = "RestartJobSet", None, first
    for rule in policy.get("rules") or []:
        matching = [job for job in buckets.failed if _rule_matches(rule, job)]
        if matching:
            action, rule_name, target = rule.get("action", "RestartJobSet"), rule.get("name"), _first_failed(matching)
            break
    suffix = f"(first failed job: {target['metadata']['name']})"
    if action == "FailJobSet":
        _fail(status, plan, "FailJobSetFailurePolicyAction",
              f"applying FailJobSet failure policy action {suffix}", now)
        return
    if action == "RestartJobSet":
        max_restarts = int(policy.get("maxRestarts") or 0)
        if int(status.get("restartsCountTowardsMax") or 0) >= max_restarts:
            _fail(status, plan, "ReachedMaxRestarts",
                  f"jobset failed due to reaching max number of restarts {suffix}", now)
            return
        status["restartsCountTowardsMax"] = int(status.get("restartsCountTowardsMax") or 0) + 1
    status["restarts"] = int(status.get("restarts") or 0) + 1
    message = f"applying {action} failure policy action {suffix}"
    plan.events.append(("Warning", f"{action}FailurePolicyAction", message))
    reason = f"FailurePolicy_{rule_name}" if rule_name else "DefaultFailurePolicy"
    set_jobset_condition(conditions, "RestartingJobSet", "True", reason, message, now)


def _fail(status: dict[str, Any], plan: JobSetPlan, reason: str, message: str, now: str) -> None:
    if set_jobset_condition(status["conditions"], "Failed", "True", reason, message, now):
        plan.events.append(("Warning", reason, message))
    status["terminalState"] = "Failed"
    set_jobset_condition(status["conditions"], "RestartingJobSet", "False", "JobSetFailed", "jobset failed", now)


def _success_met(jobset: dict[str, Any], buckets: Buckets) -> bool:
    spec = jobset.get("spec") or {}
    policy = spec.get("successPolicy") or {"operator": "All"}
    rjobs = spec.get("replicatedJobs") or []
    targets = policy.get("targetReplicatedJobs") or [r["name"] for r in rjobs]
    done = sum(1 for job in buckets.succeeded if _rjob_of(job) in targets)
    if policy.get("operator") == "Any":
        return done >= 1
    return done >= sum(replicas_of(r) for r in rjobs if r["name"] in targets)


def _satisfied(rjob: dict[str, Any], counts: dict[str, dict[str, int]],
               replicas: dict[str, int]) -> bool:
    for dependency in rjob.get("dependsOn") or []:
        name = dependency.get("name", "")
        entry = counts.get(name)
        if entry is None:
            return False
        if dependency.get("status") == "Complete":
            if entry["succeeded"] != replicas.get(name, 0):
                return False
        elif entry["ready"] + entry["succeeded"] + entry["failed"] != replicas.get(name, 0):
            return False
    return True


def _started(rjob: dict[str, Any], counts: dict[str, dict[str, int]]) -> bool:
    entry = counts[rjob["name"]]
    return entry["ready"] + entry["succeeded"] + entry["failed"] == replicas_of(rjob)


def _merge_template(job: dict[str, Any], rjob: dict[str, Any]) -> dict[str, Any]:
    """Pod-template fields a resume copies from the JobSet onto a suspended Job (§3.5)."""
    source = ((rjob.get("template") or {}).get("spec") or {}).get("template") or {}
    current = ((job.get("spec") or {}).get("template")) or {}
    smeta, cmeta = source.get("metadata") or {}, current.get("metadata") or {}
    sspec, cspec = source.get("spec") or {}, current.get("spec") or {}
    patch_meta = {"labels": {**(cmeta.get("labels") or {}), **(smeta.get("labels") or {})},
                  "annotations": {**(cmeta.get("annotations") or {}), **(smeta.get("annotations") or {})}}
    patch_spec: dict[str, Any] = {}
    if sspec.get("nodeSelector") or cspec.get("nodeSelector"):
        patch_spec["nodeSelector"] = {**(cspec.get("nodeSelector") or {}), **(sspec.get("nodeSelector") or {})}
    for key in ("tolerations", "schedulingGates"):
        merged = list(cspec.get(key) or [])
        for item in sspec.get(key) or []:
            if item not in merged:
                merged.append(item)
        if merged:
            patch_spec[key] = merged
    return {"metadata": patch_meta, "spec": patch_spec}


def _scale_jobs(rjobs: list[dict[str, Any]], active: list[dict[str, Any]]) -> list[tuple[str, int | None, int | None]]:
    """``ElasticJobSet``: the unfinished current Jobs whose ``parallelism``/``completions`` differ
    from their replicated Job's template, to be changed in place (never recreated). A template
    whose two values differ is left alone (not a valid elastic size)."""
    desired = {}
    for rjob in rjobs:
        spec = (rjob.get("template") or {}).get("spec") or {}
        desired[rjob.get("name")] = (spec.get("parallelism"), spec.get("completions"))
    out = []
    for job in active:
        wanted = desired.get(_rjob_of(job))
        if wanted is None or wanted[0] != wanted[1] or _deleting(job):
            continue
        spec = job.get("spec") or {}
        if (spec.get("parallelism"), spec.get("completions")) != wanted:
            out.append((job["metadata"]["name"], wanted[0], wanted[1]))
    return out


def _create_missing_jobs(jobset: dict[str, Any], owned: list[dict[str, Any]], buckets: Any,
                         counts: dict[str, dict[str, Any]], replicas: dict[str, int], status: dict[str, Any],
                         stamp: str, plan: JobSetPlan) -> None:
    """The Jobs to create, honoring startup order and dependsOn (§3.4), with the startup
    policy's conditions."""
    meta, spec = jobset.get("metadata") or {}, jobset.get("spec") or {}
    rjobs = spec.get("replicatedJobs") or []
    suspended = bool(spec.get("suspend"))
    conditions = status["conditions"]
    existing = {j["metadata"]["name"] for j in owned}
    in_order = ((spec.get("startupPolicy") or {}).get("startupPolicyOrder") == "InOrder")
    blocking = ((spec.get("failurePolicy") or {}).get("restartStrategy") == "BlockingRecreate")
    walk_complete = True
    for position, rjob in enumerate(rjobs):
        missing = [j for j in range(replicas_of(rjob))
                   if job_name(meta["name"], rjob["name"], j) not in existing]
        if blocking and buckets.previous:
            missing = []
        if not _satisfied(rjob, counts, replicas):
            continue
        if not suspended and in_order and _started(rjob, counts):
            continue
        plan.create_jobs.extend(build_job(jobset, position, j, status["restarts"]) for j in missing)
        if not suspended and in_order:
            if set_jobset_condition(conditions, "StartupPolicyInProgress", "True",
                                    "InOrderStartupPolicyInProgress",
                                    "in order startup policy is in progress", stamp):
                plan.events.append(("Normal", "InOrderStartupPolicyInProgress",
                                    "in order startup policy is in progress"))
            walk_complete = False
            break
    if walk_complete and not suspended and in_order:
        if set_jobset_condition(conditions, "StartupPolicyCompleted", "True",
                                "InOrderStartupPolicyCompleted",
                                "in order startup policy has completed", stamp):
            plan.events.append(("Normal", "InOrderStartupPolicyCompleted",
                                "in order startup policy has completed"))


def _resume_jobs(jobset: dict[str, Any], buckets: Any, counts: dict[str, dict[str, Any]],
                 replicas: dict[str, int], conditions: list[dict[str, Any]], stamp: str, plan: JobSetPlan) -> None:
    """The suspended Jobs of a resumed JobSet to resume (in startup order when it asks), and the
    Suspended condition's end once all are (§3.5)."""
    spec = jobset.get("spec") or {}
    rjobs = spec.get("replicatedJobs") or []
    in_order = ((spec.get("startupPolicy") or {}).get("startupPolicyOrder") == "InOrder")
    resume_complete = True
    for rjob in rjobs:
        if not _satisfied(rjob, counts, replicas):
            continue
        if in_order and _started(rjob, counts):
            continue
        for job in buckets.active:
            if _rjob_of(job) == rjob["name"] and (job.get("spec") or {}).get("suspend"):
                clear = bool((job.get("status") or {}).get("startTime"))
                plan.resume_jobs.append((job["metadata"]["name"], _merge_template(job, rjob), clear))
        if in_order:
            set_jobset_condition(conditions, "StartupPolicyInProgress", "True",
                                 "InOrderStartupPolicyInProgress",
                                 "in order startup policy is in progress", stamp)
            resume_complete = False
            break
    if resume_complete:
        if set_jobset_condition(conditions, "Suspended", "False", "ResumeJobs", "jobset is resumed", stamp):
            plan.events.append(("Normal", "ResumeJobs", "jobset is resumed"))


def plan_jobset(jobset: dict[str, Any], jobs: list[dict[str, Any]], service_exists: bool,
                now: datetime, elastic: bool = False) -> JobSetPlan:
    """``elastic``: the ``ElasticJobSet`` feature gate is on."""
    plan = JobSetPlan()
    meta = jobset.get("metadata") or {}
    spec = jobset.get("spec") or {}
    if meta.get("deletionTimestamp"):
        return plan
    if spec.get("managedBy") and spec["managedBy"] != CONTROLLER_NAME:
        return plan
    stamp = format_time(now)
    old_status = jobset.get("status") or {}
    status = copy.deepcopy(old_status)
    status["restarts"] = int(status.get("restarts") or 0)
    status.setdefault("conditions", [])
    conditions = status["conditions"]
    owned = [job for job in jobs if _controller_uid(job) == meta.get("uid")]
    buckets = classify(owned, status["restarts"])
    counts_list = replicated_jobs_status(jobset, buckets)
    status["replicatedJobsStatus"] = counts_list
    counts = {entry["name"]: entry for entry in counts_list}
    rjobs = spec.get("replicatedJobs") or []
    replicas = {r["name"]: replicas_of(r) for r in rjobs}
    suspended = bool(spec.get("suspend"))

    def finish() -> JobSetPlan:
        if not status["conditions"]:
            status.pop("conditions")
        if status != old_status:
            plan.status = status
        return plan

    if is_true(conditions, "Completed") or is_true(conditions, "Failed"):
        plan.delete_jobs.extend(j["metadata"]["name"] for j in buckets.active if not _deleting(j))
        ttl = spec.get("ttlSecondsAfterFinished")
        if ttl is not None:
            terminal = next((c for c in conditions if c.get("type") in ("Completed", "Failed")
                             and c.get("status") == "True"), {})
            finished_at = parse_time(terminal.get("lastTransitionTime")) or now
            due = finished_at + timedelta(seconds=int(ttl))
            if now >= due:
                plan.delete_self = True
            else:
                plan.requeue_after = (due - now).total_seconds()
        return finish()

    plan.delete_jobs.extend(j["metadata"]["name"] for j in buckets.previous if not _deleting(j))

    total_ready = sum(e["ready"] + e["succeeded"] for e in counts_list)
    if not suspended and total_ready == sum(replicas.values()):
        set_jobset_condition(conditions, "RestartingJobSet", "False", "JobsReady", "all jobs are ready", stamp)

    if buckets.failed:
        _apply_failure_policy(jobset, buckets, status, plan, stamp)
        return finish()

    if buckets.succeeded and _success_met(jobset, buckets):
        if set_jobset_condition(conditions, "Completed", "True", "AllJobsCompleted",
                                "jobset completed successfully", stamp):
            plan.events.append(("Normal", "AllJobsCompleted", "jobset completed successfully"))
        status["terminalState"] = "Completed"
        set_jobset_condition(conditions, "RestartingJobSet", "False", "JobSetCompleted",
                             "jobset completed successfully", stamp)
        return finish()

    if dns_enabled(jobset) and not service_exists:
        plan.create_service = build_service(jobset)
    if elastic:
        plan.scale_jobs = _scale_jobs(rjobs, buckets.active)

    # Create missing Jobs, honoring startup order and dependsOn (§3.4).
    _create_missing_jobs(jobset, owned, buckets, counts, replicas, status, stamp, plan)

    # Suspend or resume (§3.5).
    if suspended:
        plan.suspend_jobs.extend(j["metadata"]["name"] for j in buckets.active
                                 if not (j.get("spec") or {}).get("suspend"))
        if set_jobset_condition(conditions, "Suspended", "True", "SuspendedJobs", "jobset is suspended", stamp):
            plan.events.append(("Normal", "SuspendedJobs", "jobset is suspended"))
        set_jobset_condition(conditions, "RestartingJobSet", "False", "JobSetSuspended",
                             "jobset is suspended", stamp)
        return finish()
    _resume_jobs(jobset, buckets, counts, replicas, conditions, stamp, plan)
    return finish()
