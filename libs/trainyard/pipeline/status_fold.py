"""The status service's fold, as pure functions: the TrainJob status it should write, the
condition transitions that deserve an Event, and the runtime a TrainJob keeps in use.

The status service (services/status) reads the snapshots and writes; everything it decides
lives here, beside the pipeline's ``compute_trainjob_status``, so it is testable without a bus
or an API server.
"""
from __future__ import annotations

from typing import Any, Protocol

from trainyard.api.constants import CONDITION_SUSPENDED, MESSAGE_RESUMED, REASON_RESUMED

from .elastic import CONDITION_RESIZING, REASON_RESIZE_REFUSED
from .lifecycle import finished_condition, trainjob_state
from .status import compute_trainjob_status, set_condition
from .trainjobs import REASON_CREATION_FAILED, creation_failed_message


class FailureOutcome(Protocol):
    """The last planning or apply failure of a TrainJob (the bus's ``Outcome``)."""

    uid: str
    reason: str
    message: str


COMPONENT = "trainer-trainjob-controller"
RUNTIME_COMPONENTS = {"TrainingRuntime": "trainer-trainingruntime-controller",
                      "ClusterTrainingRuntime": "trainer-clustertrainingruntime-controller"}


def desired_status(trainjob: dict[str, Any], jobset: dict[str, Any] | None,
                   outcome: FailureOutcome | None, now: str) -> dict[str, Any]:
    """The pipeline's status fold, plus a ``Failed`` condition while planning or applying
    fails (removed again by the fold's first step once the failure is gone), and ``state``
    for the ``Status`` printer column."""
    status = compute_trainjob_status(trainjob, jobset, now)
    uid = trainjob["metadata"].get("uid")
    conditions = [c for c in status.get("conditions") or [] if c.get("type") != CONDITION_RESIZING]
    if conditions != list(status.get("conditions") or []):
        if conditions:
            status["conditions"] = conditions
        else:
            status.pop("conditions", None)
    if outcome is not None and outcome.uid == uid and finished_condition(status) is None \
            and resize_pending(status):
        # An elastic resize the API server refused (e.g. JobSet's ElasticJobSet gate off): the
        # job keeps running at its current size, so this is no Failed condition.
        set_condition(conditions, {"type": CONDITION_RESIZING, "status": "False", "reason": REASON_RESIZE_REFUSED,
                                   "message": outcome.message}, now)
        status["conditions"] = conditions
    elif outcome is not None and outcome.uid == uid and finished_condition(status) is None:
        conditions = list(status.get("conditions") or [])
        failed = next((c for c in conditions if c.get("type") == "Failed"), None)
        if failed is None or failed.get("reason") == outcome.reason:
            set_condition(conditions, {"type": "Failed", "status": "True", "reason": outcome.reason,
                                       "message": creation_failed_message(outcome.message)}, now)
            status["conditions"] = conditions
    status["state"] = trainjob_state(trainjob, status)
    return status


def resize_pending(status: dict[str, Any]) -> bool:
    """An elastic TrainJob whose JobSet does not run at the asked size yet."""
    found = status.get("elastic") or {}
    return found.get("currentNodes") is not None and found.get("desiredNodes") is not None \
        and found["currentNodes"] != found["desiredNodes"]


def resized(before: dict[str, Any], after: dict[str, Any]) -> tuple[int, int] | None:
    """(from, to) when the size an elastic TrainJob runs at changed."""
    old = (before.get("elastic") or {}).get("currentNodes")
    new = (after.get("elastic") or {}).get("currentNodes")
    return (old, new) if old is not None and new is not None and old != new else None


def comparable(status: dict[str, Any]) -> dict[str, Any]:
    return status or {}


def transitions(before: dict[str, Any], after: dict[str, Any]) -> list[dict[str, Any]]:
    """Conditions that are new or changed status/reason: one Event each (a creation failure
    has its own Warning event, recorded when the failure is reported)."""
    old = {c.get("type"): c for c in (before.get("conditions") or [])}
    changed = []
    for condition in after.get("conditions") or []:
        if condition.get("reason") in (REASON_CREATION_FAILED, REASON_RESIZE_REFUSED):
            continue
        previous = old.get(condition.get("type"))
        if previous is None or previous.get("status") != condition.get("status") \
                or previous.get("reason") != condition.get("reason"):
            changed.append(condition)
    # A resume removes the Suspended condition (see trainyard.pipeline.status); it is
    # still a transition users expect to see as an Event.
    suspended = old.get(CONDITION_SUSPENDED)
    current = {c.get("type") for c in after.get("conditions") or []}
    if suspended is not None and suspended.get("status") == "True" and CONDITION_SUSPENDED not in current:
        changed.append({"type": CONDITION_SUSPENDED, "status": "False",
                        "reason": REASON_RESUMED, "message": MESSAGE_RESUMED})
    return changed
