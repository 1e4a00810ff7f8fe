"""TrainJob status from the TrainJob and its JobSet (spec §4.6.6, §5.2 steps 3-6, §5.8)."""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from trainyard.clock import format_time, parse_time
from trainyard.api import constants

from . import elastic
from .defaults import trainjob_with_defaults
from .documents import as_document, clone, dig, items, mapping
from .lifecycle import deadline_exceeded, finished_condition
from .resolution import unsupported_runtime_message

_JOB_STATUS_FIELDS = ("ready", "succeeded", "failed", "active", "suspended")


def set_condition(conditions: list[dict[str, Any]], new: dict[str, Any], now: str) -> None:
    """Kubernetes ``meta.SetStatusCondition``: append, or update in place; the transition
    time moves only when the status changes."""
    for existing in conditions:
        if existing.get("type") == new["type"]:
            if existing.get("status") != new["status"]:
                existing["status"] = new["status"]
                existing["lastTransitionTime"] = new.get("lastTransitionTime") or now
            existing["reason"] = new.get("reason", "")
            existing["message"] = new.get("message", "")
            if new.get("observedGeneration") is not None:
                existing["observedGeneration"] = new["observedGeneration"]
            else:
                existing.pop("observedGeneration", None)
            return
    condition = {"type": new["type"], "status": new["status"]}
    if new.get("observedGeneration") is not None:
        condition["observedGeneration"] = new["observedGeneration"]
    condition["lastTransitionTime"] = new.get("lastTransitionTime") or now
    condition["reason"] = new.get("reason", "")
    condition["message"] = new.get("message", "")
    conditions.append(condition)


def _condition(conditions: list[Any], condition_type: str) -> dict[str, Any] | None:
    return next((c for c in conditions if isinstance(c, dict) and c.get("type") == condition_type), None)


def compute_trainjob_status(trainjob: Any, jobset: Any | None, now: datetime | str) -> dict[str, Any]:
    """The TrainJob ``status`` after one reconcile, given the observed JobSet (or None).

    Steps: drop ``Failed``; an unsupported runtime sets ``Failed``/``TrainingRuntimeNotSupported``
    (persisted here, unlike upstream which panics); ``Suspended`` from ``spec.suspend`` (dropped on resume);
    then ``Complete``/``Failed`` and ``jobsStatus`` copied from the JobSet. Without a JobSet
    the status keeps the first steps' result. An empty status is returned as ``{}``.
    """
    job = trainjob_with_defaults(as_document(trainjob))
    moment = format_time(now)
    status = clone(mapping(job.get("status")))
    if finished_condition(status) is not None:
        # A finished TrainJob keeps its conditions whatever happens to its JobSet or spec
        # (kubeflow/trainer#3779: deleting the JobSet must not turn it back into a running
        # job); only jobsStatus still follows a JobSet that is there.
        if jobset is not None:
            jobs_status = _jobs_status(as_document(jobset))
            if jobs_status:
                status["jobsStatus"] = jobs_status
        return status
    conditions = [c for c in items(status.get("conditions")) if mapping(c).get("type") != constants.CONDITION_FAILED]
    unsupported = unsupported_runtime_message(job)
    if unsupported is not None:
        set_condition(conditions, {"type": constants.CONDITION_FAILED, "status": "True",
                                   "reason": constants.REASON_TRAINING_RUNTIME_NOT_SUPPORTED, "message": unsupported}, moment)
    if dig(job, "spec", "suspend") is True:
        set_condition(conditions, {"type": constants.CONDITION_SUSPENDED, "status": "True",
                                   "reason": constants.REASON_SUSPENDED, "message": constants.MESSAGE_SUSPENDED}, moment)
    else:
        # Resume drops the Suspended condition instead of writing upstream's
        # Suspended=False/Resumed: the Kubeflow SDK reads any condition as "not Running"
        # (kubeflow/sdk#803) and the State column shows the last condition's type
        # (kubeflow/trainer#3666). The status service records the resume as an Event.
        conditions = [c for c in conditions if mapping(c).get("type") != constants.CONDITION_SUSPENDED]
    if unsupported is None and jobset is not None:
        jobset_doc = as_document(jobset)
        jobset_conditions = items(dig(jobset_doc, "status", "conditions"))
        policy = elastic.jobset_policy(jobset_doc)
        for source, target in ((constants.JOBSET_CONDITION_COMPLETED, constants.CONDITION_COMPLETE),
                               (constants.JOBSET_CONDITION_FAILED, constants.CONDITION_FAILED)):
            found = _condition(jobset_conditions, source)
            if found is not None and found.get("status") == "True":
                copied = {**found, "type": target}
                if policy is not None and target == constants.CONDITION_FAILED:
                    # Elastic: a trainer Job fails only once torchrun's restart budget is spent.
                    copied["reason"] = elastic.REASON_RESTARTS_EXHAUSTED
                    copied["message"] = elastic.failed_message(policy, str(found.get("message") or ""))
                set_condition(conditions, copied, moment)
        if policy is not None:
            status["elastic"] = elastic_status(job, jobset_doc, policy)
        jobs_status = _jobs_status(jobset_doc)
        if jobs_status:
            status["jobsStatus"] = jobs_status
        else:
            status.pop("jobsStatus", None)
    current = parse_time(now) if isinstance(now, str) else now
    # The deadline reads the status as it was (a Suspended=True about to be dropped means the
    # resume is just happening), unless the JobSet finished first.
    if unsupported is None and current is not None \
            and finished_condition({"conditions": conditions}) is None \
            and deadline_exceeded(job, jobset, current):
        # v2.3.0 activeDeadlineSeconds; the status service also deletes the JobSet.
        set_condition(conditions, {"type": constants.CONDITION_FAILED, "status": "True",
                                   "reason": constants.REASON_DEADLINE_EXCEEDED,
                                   "message": constants.MESSAGE_DEADLINE_EXCEEDED}, moment)
    if conditions:
        status["conditions"] = conditions
    else:
        status.pop("conditions", None)
    return status


def elastic_status(trainjob: dict[str, Any], jobset_doc: dict[str, Any], policy: dict[str, Any]) -> dict[str, Any]:
    """``status.elastic`` of an elastic TrainJob: the size its JobSet runs at, the size asked for,
    the bounds, and the trainer pods' selector (the scale subresource reads these)."""
    found: dict[str, Any] = {}
    current = elastic.jobset_size(jobset_doc)
    if current is not None:
        found["currentNodes"] = current
    desired = dig(trainjob, "spec", "trainer", "numNodes")
    if isinstance(desired, int):
        found["desiredNodes"] = desired
    for key in ("minNodes", "maxNodes"):
        if isinstance(policy.get(key), int):
            found[key] = policy[key]
    found["selector"] = elastic.selector(str(dig(trainjob, "metadata", "name") or ""), jobset_doc)
    return found


def _jobs_status(jobset_doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"name": entry.get("name"), **{key: entry.get(key, 0) for key in _JOB_STATUS_FIELDS}}
        for entry in items(dig(jobset_doc, "status", "replicatedJobsStatus")) if isinstance(entry, dict)
    ]
