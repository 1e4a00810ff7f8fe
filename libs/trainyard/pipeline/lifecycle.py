"""When a TrainJob is finished, when it runs out of time, and when it may be deleted.

Pure functions over the wire form, shared by the planner (a finished TrainJob is never planned
again), the status service (terminal conditions are kept, the deadline and the TTL are
enforced) and the tests.

* Finished: ``Complete=True``, or ``Failed=True`` with a reason that means the training ran and
  failed (JobSet failure reasons, ``DeadlineExceeded``). ``Failed`` for an unsupported runtime
  or a failed plan/apply is not final: it goes away when the cause is fixed (as upstream).
* ``spec.activeDeadlineSeconds`` (v2.3.0) counts from the creation, or from the last resume;
  a suspended TrainJob has no deadline.
* TTL after finished is a trainyard addition (annotation
  ``trainyard.kubeflow.org/ttl-seconds-after-finished``), counted from the terminal condition's
  ``lastTransitionTime``.
"""
from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from trainyard.clock import parse_time
from trainyard.api import constants

from .documents import as_document, dig, items, mapping

# Failed conditions that do not end a TrainJob: nothing ran yet, and fixing the cause resumes it.
NOT_FINAL_FAILURE_REASONS = frozenset({constants.REASON_TRAINING_RUNTIME_NOT_SUPPORTED,
                                       constants.EVENT_REASON_RESOURCES_CREATION_FAILED})


def _true_condition(conditions: Any, condition_type: str) -> dict[str, Any] | None:
    return next((c for c in items(conditions) if isinstance(c, dict) and c.get("type") == condition_type
                 and c.get("status") == "True"), None)


def finished_condition(status: Any) -> dict[str, Any] | None:
    """The condition that makes a TrainJob with this ``status`` finished, or None."""
    conditions = mapping(status).get("conditions")
    complete = _true_condition(conditions, constants.CONDITION_COMPLETE)
    if complete is not None:
        return complete
    failed = _true_condition(conditions, constants.CONDITION_FAILED)
    if failed is not None and failed.get("reason") not in NOT_FINAL_FAILURE_REASONS:
        return failed
    return None


def is_finished(trainjob: Any) -> bool:
    return finished_condition(dig(as_document(trainjob), "status")) is not None


def trainjob_state(trainjob: Any, status: Any) -> str:
    """``status.state``: the last word on what the TrainJob is doing, never blank."""
    conditions = mapping(status).get("conditions")
    if _true_condition(conditions, constants.CONDITION_COMPLETE) is not None:
        return constants.CONDITION_COMPLETE
    if _true_condition(conditions, constants.CONDITION_FAILED) is not None:
        return constants.CONDITION_FAILED
    if dig(as_document(trainjob), "spec", "suspend") is True:
        return constants.STATE_SUSPENDED
    return constants.STATE_RUNNING


def _resumed_at(trainjob: dict[str, Any], jobset: Any | None) -> datetime | None:
    """When the TrainJob was last resumed. trainyard drops the TrainJob's Suspended condition on
    resume (docs/compatibility.md #11), so the JobSet's ``Suspended=False`` transition is the
    record; an upstream-style ``Suspended=False`` on the TrainJob counts too."""
    times = []
    for conditions in (dig(trainjob, "status", "conditions"),
                       dig(as_document(jobset), "status", "conditions") if jobset is not None else None):
        for condition in items(conditions):
            if isinstance(condition, dict) and condition.get("type") == constants.CONDITION_SUSPENDED \
                    and condition.get("status") == "False":
                moment = parse_time(condition.get("lastTransitionTime"))
                if moment is not None:
                    times.append(moment)
    return max(times) if times else None


def _latest_suspended(conditions: Any) -> str | None:
    found = [c for c in items(conditions) if isinstance(c, dict) and c.get("type") == constants.CONDITION_SUSPENDED]
    return found[-1].get("status") if found else None


def resume_pending(trainjob: dict[str, Any], jobset: Any | None) -> bool:
    """Resumed in the spec, but not yet seen running: the TrainJob's status or its JobSet still
    says suspended. The clock restarts once the JobSet records the resume."""
    if _latest_suspended(dig(trainjob, "status", "conditions")) == "True":
        return True
    if jobset is None:
        return False
    jobset_doc = as_document(jobset)
    return dig(jobset_doc, "spec", "suspend") is True \
        or _latest_suspended(dig(jobset_doc, "status", "conditions")) == "True"


def active_deadline(trainjob: Any, jobset: Any | None = None) -> datetime | None:
    """The moment ``spec.activeDeadlineSeconds`` runs out, or None when it does not apply
    (unset or 0, finished, suspended, or resumed but not running yet)."""
    job = as_document(trainjob)
    seconds = dig(job, "spec", "activeDeadlineSeconds")
    if not isinstance(seconds, int) or isinstance(seconds, bool) or seconds <= 0:
        return None
    if is_finished(job) or dig(job, "spec", "suspend") is True or resume_pending(job, jobset):
        return None
    start = parse_time(dig(job, "metadata", "creationTimestamp"))
    resumed = _resumed_at(job, jobset)
    if resumed is not None and (start is None or resumed > start):
        start = resumed
    if start is None:
        return None
    return start + timedelta(seconds=seconds)


def deadline_exceeded(trainjob: Any, jobset: Any | None, now: datetime) -> bool:
    deadline = active_deadline(trainjob, jobset)
    return deadline is not None and now > deadline


def ttl_seconds_after_finished(trainjob: Any) -> int | None:
    """The opt-in TTL annotation as a non-negative integer; None when absent or malformed."""
    value = mapping(dig(as_document(trainjob), "metadata", "annotations")).get(
        constants.ANNOTATION_TTL_SECONDS_AFTER_FINISHED)
    if not isinstance(value, str) or not value.isdigit():
        return None
    return int(value)


def ttl_expiry(trainjob: Any) -> datetime | None:
    """When a finished TrainJob with the TTL annotation is to be deleted; None otherwise."""
    job = as_document(trainjob)
    ttl = ttl_seconds_after_finished(job)
    if ttl is None:
        return None
    condition = finished_condition(dig(job, "status"))
    if condition is None:
        return None
    finished_at = parse_time(condition.get("lastTransitionTime"))
    if finished_at is None:
        return None
    return finished_at + timedelta(seconds=ttl)
