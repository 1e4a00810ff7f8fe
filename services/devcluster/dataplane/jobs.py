"""The batch/v1 Job controller's decisions for one Job (pure).

``plan_job(job, pods, now)`` looks at a Job and the pods it controls and returns what to do:
pods to create (Indexed completion mode), pods to delete, tracking finalizers to remove, the
new ``status`` and events. Counting follows the upstream finalizer protocol: a finished pod
is counted once, recorded in ``uncountedTerminatedPods`` in the same status write that adds
it to ``succeeded``/``failed``, and only then loses its ``batch.kubernetes.io/job-tracking``
finalizer.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

TRACKING_FINALIZER = "batch.kubernetes.io/job-tracking"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
CONTROLLER_UID_LABELS = ("batch.kubernetes.io/controller-uid", "controller-uid")
JOB_NAME_LABELS = ("batch.kubernetes.io/job-name", "job-name")
JOB_COMPLETION_INDEX_ENV = "JOB_COMPLETION_INDEX"
DEFAULT_BACKOFF_LIMIT = 6
POD_FAILURE_BACKOFF_S = 10.0
POD_FAILURE_BACKOFF_MAX_S = 600.0

MSG_BACKOFF = "Job has reached the specified backoff limit"
MSG_DEADLINE = "Job was active longer than specified deadline"
MSG_COMPLETE = "Reached expected number of succeeded pods"


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.strptime(value[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc)
    except ValueError:
        return None


def format_time(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class JobPlan:
    create: list[dict[str, Any]] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)          # pod names
    delete_untracked: list[str] = field(default_factory=list)  # remove finalizer first (not counted)
    remove_finalizer: list[str] = field(default_factory=list)  # after the status write
    status: dict[str, Any] = field(default_factory=dict)
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, message)
    requeue_after: float | None = None
    delete_self: bool = False  # ttlSecondsAfterFinished has passed


def condition(conditions: list[dict[str, Any]], kind: str) -> dict[str, Any] | None:
    return next((c for c in conditions if c.get("type") == kind), None)


def is_true(conditions: list[dict[str, Any]], kind: str) -> bool:
    found = condition(conditions, kind)
    return bool(found and found.get("status") == "True")


def set_job_condition(conditions: list[dict[str, Any]], kind: str, status: str, reason: str,
                      message: str, now: str) -> bool:
    """Job set semantics: replace on any difference; never append a False condition."""
    found = condition(conditions, kind)
    if found is None:
        if status != "True":
            return False
        conditions.append({"type": kind, "status": status, "lastProbeTime": now,
                           "lastTransitionTime": now, "reason": reason, "message": message})
        return True
    if (found.get("status"), found.get("reason"), found.get("message")) == (status, reason, message):
        return False
    found.update({"status": status, "reason": reason, "message": message,
                  "lastProbeTime": now, "lastTransitionTime": now})
    return True


def pod_index(pod: dict[str, Any]) -> int | None:
    meta = pod.get("metadata") or {}
    raw = (meta.get("annotations") or {}).get(COMPLETION_INDEX) or (meta.get("labels") or {}).get(COMPLETION_INDEX)
    try:
        return int(raw)
    except (TypeError, ValueError):
        return None


def phase(pod: dict[str, Any]) -> str:
    return (pod.get("status") or {}).get("phase") or "Pending"


def is_deleting(pod: dict[str, Any]) -> bool:
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def has_tracking(pod: dict[str, Any]) -> bool:
    return TRACKING_FINALIZER in ((pod.get("metadata") or {}).get("finalizers") or [])


def pod_ready(pod: dict[str, Any]) -> bool:
    return is_true((pod.get("status") or {}).get("conditions") or [], "Ready")


def compress_indexes(indexes: set[int]) -> str:
    """``{0,1,2,5}`` -> ``"0-2,5"``."""
    ordered = sorted(indexes)
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def parse_indexes(text: str | None) -> set[int]:
    out: set[int] = set()
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            low, high = part.split("-", 1)
            out.update(range(int(low), int(high) + 1))
        else:
            out.add(int(part))
    return out


def build_pod(job: dict[str, Any], index: int) -> dict[str, Any]:
    """A pod for one completion index of an Indexed Job (§2.3 of the data-plane spec)."""
    meta = job.get("metadata") or {}
    name = meta.get("name", "")
    template = copy.deepcopy((job.get("spec") or {}).get("template") or {})
    tmeta = template.get("metadata") or {}
    labels = dict(tmeta.get("labels") or {})
    annotations = dict(tmeta.get("annotations") or {})
    for key in CONTROLLER_UID_LABELS:
        labels[key] = meta.get("uid", "")
    for key in JOB_NAME_LABELS:
        labels[key] = name
    labels[COMPLETION_INDEX] = str(index)
    annotations[COMPLETION_INDEX] = str(index)
    spec = template.get("spec") or {}
    spec["hostname"] = f"{name}-{index}"
    ref = {"name": JOB_COMPLETION_INDEX_ENV,
           "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX}']"}}}
    for kind in ("initContainers", "containers"):
        for container in spec.get(kind) or []:
            env = container.setdefault("env", [])
            if not any(var.get("name") == JOB_COMPLETION_INDEX_ENV for var in env):
                env.append(copy.deepcopy(ref))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": f"{name}-{index}-",
            "namespace": meta.get("namespace", "default"),
            "labels": labels,
            "annotations": annotations,
            "finalizers": [TRACKING_FINALIZER],
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": name,
                                 "uid": meta.get("uid", ""), "controller": True,
                                 "blockOwnerDeletion": True}],
        },
        "spec": spec,
    }


def _pod_failure_policy_match(job: dict[str, Any], pod: dict[str, Any]) -> tuple[str, str] | None:
    """(action, message) of the first podFailurePolicy rule matching a Failed pod."""
    rules = ((job.get("spec") or {}).get("podFailurePolicy") or {}).get("rules") or []
    meta = pod.get("metadata") or {}
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    for number, rule in enumerate(rules):
        on_codes = rule.get("onExitCodes")
        if on_codes:
            wanted = set(on_codes.get("values") or [])
            for status in statuses:
                if on_codes.get("containerName") and status.get("name") != on_codes["containerName"]:
                    continue
                code = ((status.get("state") or {}).get("terminated") or {}).get("exitCode")
                if code is None or code == 0:
                    continue
                hit = code in wanted if on_codes.get("operator", "In") == "In" else code not in wanted
                if hit:
                    return rule.get("action", ""), (
                        f"Container {status.get('name')} for pod {meta.get('namespace')}/"
                        f"{meta.get('name')} failed with exit code {code} matching "
                        f"{rule.get('action')} rule at index {number}")
        for wanted_condition in rule.get("onPodConditions") or []:
            for present in (pod.get("status") or {}).get("conditions") or []:
                if present.get("type") == wanted_condition.get("type") and \
                        present.get("status") == wanted_condition.get("status", "True"):
                    return rule.get("action", ""), (
                        f"Pod {meta.get('namespace')}/{meta.get('name')} has condition "
                        f"{present.get('type')} matching {rule.get('action')} rule at index {number}")
    return None


def _finish_time(pod: dict[str, Any]) -> datetime | None:
    latest = None
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        moment = parse_time(((status.get("state") or {}).get("terminated") or {}).get("finishedAt"))
        if moment and (latest is None or moment > latest):
            latest = moment
    return latest


def _count_terminated(job: dict[str, Any], pods: list[dict[str, Any]], status: dict[str, Any],
                      completions: int, plan: JobPlan) -> tuple[set[int], int, tuple[str, str] | None]:
    """Counts each finished pod once (the finalizer protocol): into ``status`` (succeeded and
    failed counts, completed indexes, uncounted pods) and ``plan`` (finalizers to remove).
    Returns (succeeded indexes, failures, the first pod failure policy FailJob match)."""
    uncounted = status.get("uncountedTerminatedPods") or {}
    uncounted_ok = set(uncounted.get("succeeded") or [])
    uncounted_failed = set(uncounted.get("failed") or [])
    present_uids = set()
    # Indexes at or above completions (an elastic Indexed Job scaled down) no longer count.
    succeeded_indexes = {i for i in parse_indexes(status.get("completedIndexes")) if i < completions}
    failed = int(status.get("failed") or 0)
    new_uncounted_ok: list[str] = []
    new_uncounted_failed: list[str] = []
    failure_match: tuple[str, str] | None = None
    ignored_failures = 0
    for pod in pods:
        uid = (pod.get("metadata") or {}).get("uid", "")
        name = (pod.get("metadata") or {}).get("name", "")
        present_uids.add(uid)
        if not has_tracking(pod):
            continue
        pod_phase = phase(pod)
        index = pod_index(pod)
        if pod_phase == "Succeeded":
            if uid not in uncounted_ok and index is not None and index < completions:
                succeeded_indexes.add(index)
            new_uncounted_ok.append(uid)
            plan.remove_finalizer.append(name)
        elif pod_phase == "Failed" or is_deleting(pod):
            if pod_phase != "Failed" and (pod.get("spec") or {}).get("nodeName"):
                # A terminating pod on the node is counted once it stops (phase terminal);
                # one never bound has no process to wait for.
                continue
            if index is not None and index >= completions:
                # removed by a scale-down (elastic Indexed Job): not a failure
                plan.remove_finalizer.append(name)
                continue
            match = _pod_failure_policy_match(job, pod) if pod_phase == "Failed" else None
            if uid not in uncounted_failed:
                if match and match[0] == "Ignore":
                    ignored_failures += 1
                else:
                    failed += 1
                if match and match[0] == "FailJob" and failure_match is None:
                    failure_match = match
            new_uncounted_failed.append(uid)
            plan.remove_finalizer.append(name)
    status["uncountedTerminatedPods"] = {}
    if new_uncounted_ok:
        status["uncountedTerminatedPods"]["succeeded"] = new_uncounted_ok
    if new_uncounted_failed:
        status["uncountedTerminatedPods"]["failed"] = new_uncounted_failed
    status["completedIndexes"] = compress_indexes(succeeded_indexes)
    status["succeeded"] = len(succeeded_indexes)
    status["failed"] = failed
    return succeeded_indexes, failed, failure_match


def _failure(spec: dict[str, Any], status: dict[str, Any], conditions: list[dict[str, Any]],
             pods: list[dict[str, Any]], failed: int, failure_match: tuple[str, str] | None,
             now: datetime, plan: JobPlan) -> tuple[str, str] | None:
    """(reason, message) of the Job's failure, if it failed: a FailureTarget already set, a pod
    failure policy's FailJob, the back-off limit, or the active deadline (which, not yet reached,
    sets when to look again)."""
    backoff_limit = int(spec.get("backoffLimit") if spec.get("backoffLimit") is not None else DEFAULT_BACKOFF_LIMIT)
    restart_policy = (((spec.get("template") or {}).get("spec")) or {}).get("restartPolicy", "Never")
    failure: tuple[str, str] | None = None
    target = condition(conditions, "FailureTarget")
    if target is not None and target.get("status") == "True":
        failure = (target.get("reason", ""), target.get("message", ""))
    elif failure_match is not None:
        failure = ("PodFailurePolicy", failure_match[1])
    elif failed > backoff_limit:
        failure = ("BackoffLimitExceeded", MSG_BACKOFF)
    elif restart_policy == "OnFailure":
        restarts = sum(int(s.get("restartCount") or 0)
                       for p in pods if phase(p) in ("Running", "Pending")
                       for s in ((p.get("status") or {}).get("containerStatuses") or [])
                       + ((p.get("status") or {}).get("initContainerStatuses") or []))
        if (backoff_limit == 0 and restarts > 0) or (backoff_limit > 0 and restarts >= backoff_limit):
            failure = ("BackoffLimitExceeded", MSG_BACKOFF)
    if failure is None and spec.get("activeDeadlineSeconds") is not None:
        started = parse_time(status.get("startTime")) or now
        deadline = float(spec["activeDeadlineSeconds"])
        elapsed = (now - started).total_seconds()
        if elapsed >= deadline:
            failure = ("DeadlineExceeded", MSG_DEADLINE)
        else:
            plan.requeue_after = deadline - elapsed
    return failure


def _plan_pods(job: dict[str, Any], pods: list[dict[str, Any]], active: list[dict[str, Any]],
               succeeded_indexes: set[int], completions: int, now: datetime, time_scale: float,
               plan: JobPlan) -> None:
    """The pods to create (the missing indexes, up to parallelism, after the failure back-off)
    and to delete (duplicates, indexes done or beyond completions) of a running Job."""
    spec = job.get("spec") or {}
    parallelism = int(spec.get("parallelism") if spec.get("parallelism") is not None else 1)
    restart_policy = (((spec.get("template") or {}).get("spec")) or {}).get("restartPolicy", "Never")
    held: dict[int, list[dict[str, Any]]] = {}
    for pod in active:
        index = pod_index(pod)
        if index is None or index >= completions or index in succeeded_indexes:
            plan.delete.append(pod["metadata"]["name"])
            continue
        held.setdefault(index, []).append(pod)
    for index, holders in held.items():
        holders.sort(key=lambda p: (pod_ready(p), phase(p) == "Running"), reverse=True)
        plan.delete.extend(p["metadata"]["name"] for p in holders[1:])
    wanted = max(0, min(parallelism, completions - len(succeeded_indexes)))
    running = len(held)
    missing = [i for i in range(completions) if i not in succeeded_indexes and i not in held]
    to_create = missing[:max(0, wanted - running)]
    if to_create and restart_policy == "Never":
        # pods removed by a scale-down are not failures: they start no back-off
        delay = _failure_backoff([p for p in pods if (pod_index(p) or 0) < completions], time_scale)
        if delay is not None:
            last_failure, seconds = delay
            remaining = (last_failure - now).total_seconds() + seconds
            if remaining > 0:
                plan.requeue_after = min(plan.requeue_after or remaining, remaining)
                to_create = []
    plan.create = [build_pod(job, index) for index in to_create]


def plan_job(job: dict[str, Any], pods: list[dict[str, Any]], now: datetime,
             time_scale: float = 1.0) -> JobPlan:
    plan = JobPlan()
    spec = job.get("spec") or {}
    old = job.get("status") or {}
    status: dict[str, Any] = copy.deepcopy(old)
    conditions: list[dict[str, Any]] = status.setdefault("conditions", [])
    stamp = format_time(now)
    completions = spec.get("completions")
    completions = int(completions) if completions is not None else 1
    suspended = bool(spec.get("suspend"))
    finished = is_true(conditions, "Complete") or is_true(conditions, "Failed")

    # -- count finished pods once (finalizer protocol) --------------------------------
    succeeded_indexes, failed, failure_match = _count_terminated(job, pods, status, completions, plan)

    active = [p for p in pods if phase(p) not in ("Succeeded", "Failed") and not is_deleting(p)]
    terminating = [p for p in pods if phase(p) not in ("Succeeded", "Failed") and is_deleting(p)]
    status["active"] = len(active)
    status["ready"] = sum(1 for p in active if pod_ready(p))
    status["terminating"] = len(terminating)

    if finished:
        plan.delete.extend(p["metadata"]["name"] for p in active)
        if spec.get("ttlSecondsAfterFinished") is not None:
            done = next((c for c in conditions if c.get("type") in ("Complete", "Failed")
                         and c.get("status") == "True"), {})
            finished_at = parse_time(status.get("completionTime") or done.get("lastTransitionTime")) or now
            remaining = (finished_at - now).total_seconds() + float(spec["ttlSecondsAfterFinished"])
            if remaining <= 0:
                plan.delete_self = True
            else:
                plan.requeue_after = remaining
        plan.status = _tidy(status)
        return plan

    # -- suspend / resume -------------------------------------------------------------
    if suspended:
        plan.delete_untracked.extend(p["metadata"]["name"] for p in active)
        status["active"] = 0
        status["ready"] = 0
        if set_job_condition(conditions, "Suspended", "True", "JobSuspended", "Job suspended", stamp):
            plan.events.append(("Normal", "Suspended", "Job suspended"))
        plan.status = _tidy(status)
        return plan
    if is_true(conditions, "Suspended"):
        set_job_condition(conditions, "Suspended", "False", "JobResumed", "Job resumed", stamp)
        plan.events.append(("Normal", "Resumed", "Job resumed"))
        status["startTime"] = stamp
    if not status.get("startTime"):
        status["startTime"] = stamp

    # -- failure ----------------------------------------------------------------------
    failure = _failure(spec, status, conditions, pods, failed, failure_match, now, plan)
    if failure is not None:
        set_job_condition(conditions, "FailureTarget", "True", failure[0], failure[1], stamp)
        plan.delete.extend(p["metadata"]["name"] for p in active)
        status["active"] = 0
        status["ready"] = 0
        if not active and not terminating:
            if set_job_condition(conditions, "Failed", "True", failure[0], failure[1], stamp):
                plan.events.append(("Warning", failure[0], failure[1]))
        plan.status = _tidy(status)
        return plan

    # -- success ----------------------------------------------------------------------
    if len(succeeded_indexes) >= completions:
        plan.delete.extend(p["metadata"]["name"] for p in active)
        set_job_condition(conditions, "SuccessCriteriaMet", "True", "CompletionsReached", MSG_COMPLETE, stamp)
        if not active and not terminating:
            if set_job_condition(conditions, "Complete", "True", "CompletionsReached", MSG_COMPLETE, stamp):
                status["completionTime"] = stamp
                plan.events.append(("Normal", "Completed", "Job completed"))
        plan.status = _tidy(status)
        return plan

    # -- pods to create / delete ------------------------------------------------------
    _plan_pods(job, pods, active, succeeded_indexes, completions, now, time_scale, plan)
    status["active"] = len(active) - len(set(plan.delete))
    plan.status = _tidy(status)
    return plan


def _failure_backoff(pods: list[dict[str, Any]], scale: float) -> tuple[datetime, float] | None:
    """(last failure time, delay) of the pod-failure back-off, None without recent failures."""
    finished = sorted(((t, phase(p)) for p in pods for t in [_finish_time(p)]
                       if t is not None and phase(p) in ("Succeeded", "Failed")),
                      key=lambda item: item[0])
    consecutive = 0
    last = None
    for moment, pod_phase in finished:
        if pod_phase == "Succeeded":
            consecutive, last = 0, None
        else:
            consecutive += 1
            last = moment
    if not consecutive or last is None:
        return None
    seconds = min(POD_FAILURE_BACKOFF_S * 2 ** (consecutive - 1), POD_FAILURE_BACKOFF_MAX_S) * scale
    return last, seconds


def _tidy(status: dict[str, Any]) -> dict[str, Any]:
    if not status.get("conditions"):
        status.pop("conditions", None)
    return status


