"""The TrainJob vocabulary every service speaks: which TrainJob owns an object, whether this
control plane manages a TrainJob, the state a TrainJob is in, the creation-failure text, and
the TrainJob's home partition on the bus.

Pure functions over the wire form (plain dicts), so the watcher, planner, applier, status and
dashboard decide these things the same way and their logic is testable without a bus.
"""
from __future__ import annotations

import hashlib
from typing import Any

from trainyard.api import constants as c

from .documents import items, mapping
from .lifecycle import finished_condition, trainjob_state

MANAGED_BY_TRAINER = c.MANAGED_BY_TRAINER
REASON_CREATION_FAILED = c.EVENT_REASON_RESOURCES_CREATION_FAILED
CREATION_FAILED_PREFIX = c.EVENT_MESSAGE_RESOURCES_CREATION_FAILED
TRAINJOB_KIND = c.TRAIN_JOB_KIND
TRAINER_GROUP = c.TRAINER_API_GROUP

__all__ = [
    "MANAGED_BY_TRAINER", "REASON_CREATION_FAILED", "TRAINJOB_KIND", "TRAINER_GROUP", "creation_failed_message",
    "finished_condition", "home_trainjob", "managed_by_trainer", "owned_by_trainjob", "owned_by_uid", "owner_reference",
    "partition_of", "state_of", "trainjob_state", "truncate_message",
]


def owner_reference(obj: Any) -> dict[str, Any] | None:
    """The ownerReference naming a TrainJob (of the trainer API group) on ``obj``, or None."""
    for ref in items(mapping(mapping(obj).get("metadata")).get("ownerReferences")):
        if isinstance(ref, dict) and ref.get("kind") == TRAINJOB_KIND \
                and str(ref.get("apiVersion", "")).startswith(TRAINER_GROUP + "/"):
            return ref
    return None


def owned_by_trainjob(obj: Any) -> bool:
    return owner_reference(obj) is not None


def owned_by_uid(obj: Any, uid: str | None) -> bool:
    """Whether ``obj`` names the object with ``uid`` among its owners (an object left over
    from an earlier TrainJob of the same name names another uid)."""
    return obj is not None and any(isinstance(ref, dict) and ref.get("uid") == uid
                                   for ref in items(mapping(mapping(obj).get("metadata")).get("ownerReferences")))


def home_trainjob(kind: str, obj: Any) -> tuple[str, str] | None:
    """(namespace, name) of the TrainJob an object belongs to: a TrainJob itself, or the
    TrainJob that owns it (its children live in its namespace); None for everything else
    (runtimes, PriorityClasses: they concern any number of TrainJobs)."""
    meta = mapping(mapping(obj).get("metadata"))
    namespace = meta.get("namespace") or ""
    if kind == TRAINJOB_KIND:
        return namespace, meta.get("name") or ""
    ref = owner_reference(obj)
    if ref is None or not ref.get("name"):
        return None
    return namespace, ref["name"]


def partition_of(namespace: str, name: str, count: int) -> int:
    """The home partition of the TrainJob ``namespace/name`` among ``count``: a stable hash
    (the same in every process and release, unlike ``hash()``), so every publisher puts a
    TrainJob's messages on the same partition."""
    if count <= 1:
        return 0
    digest = hashlib.blake2b(f"{namespace}/{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % count


def managed_by_trainer(trainjob: Any) -> bool:
    """A TrainJob this control plane reconciles: ``spec.managedBy`` unset or the trainer's
    (another value, e.g. MultiKueue's, leaves it to that controller; the field is immutable)."""
    return (mapping(mapping(trainjob).get("spec")).get("managedBy") or MANAGED_BY_TRAINER) == MANAGED_BY_TRAINER


def truncate_message(text: str) -> str:
    """Upstream's event message rule: the first 950 characters, then `` ...`` when longer."""
    if len(text) <= c.EVENT_MESSAGE_MAX_CHARS:
        return text
    return text[:c.EVENT_MESSAGE_MAX_CHARS] + c.EVENT_MESSAGE_TRUNCATION_SUFFIX


def creation_failed_message(message: str) -> str:
    """The ``TrainJobResourcesCreationFailed`` text: the prefix and the cut error (a message
    that already carries the prefix is kept as it is)."""
    if message.startswith(CREATION_FAILED_PREFIX):
        return message
    return CREATION_FAILED_PREFIX + truncate_message(message)


def state_of(status: Any) -> str:
    """The state a person is shown (the dashboard, the ``trainyard_trainjobs`` gauge):
    Complete or Failed when finished, Suspended, Running (a job has active or ready pods),
    else Pending. A non-final ``Failed`` (unsupported runtime, creation failed: it goes away
    once the cause is fixed) shows as Failed too, since that is what the user must act on."""
    status = mapping(status)
    conditions = [cond for cond in items(status.get("conditions")) if isinstance(cond, dict)]

    def true(kind: str) -> bool:
        return any(cond.get("type") == kind and cond.get("status") == "True" for cond in conditions)

    for kind in ("Failed", "Complete", "Suspended"):
        if true(kind):
            return kind
    if any((job.get("active") or 0) > 0 or (job.get("ready") or 0) > 0
           for job in items(status.get("jobsStatus")) if isinstance(job, dict)):
        return "Running"
    return "Pending"
