"""Volcano: Volcano PodGroup, group-name Pod annotation, queue/priority checks (spec §4.8)."""
from __future__ import annotations

from trainyard.api import constants as c

from typing import Any

from ..documents import dig, items, mapping
from ..errors import invalid
from ..framework import ChildKind, PlanContext, Plugin, ValidationContext, Verdict
from ..observed import ReadError, not_found_text
from . import podgroup

_SYSTEM_PRIORITY_CLASSES = c.VOLCANO_SYSTEM_PRIORITY_CLASSES


def _policy(pod_group_policy: dict[str, Any] | None) -> dict[str, Any] | None:
    policy = mapping(pod_group_policy).get("volcano")
    return policy if isinstance(policy, dict) else None


def enforce_pod_group_policy(ctx: PlanContext) -> None:
    if _policy(ctx.info.pod_group_policy) is not None:
        ctx.info.pod_annotations[c.ANNOTATION_VOLCANO_GROUP_NAME] = ctx.name


def build(ctx: PlanContext) -> list[dict[str, Any]]:
    policy = _policy(ctx.info.pod_group_policy)
    if policy is None or not podgroup.should_emit(ctx, c.VOLCANO_API_VERSION):
        return []
    spec: dict[str, Any] = {"minMember": podgroup.min_member(ctx), "minResources": podgroup.min_resources(ctx)}
    queue = ctx.info.annotations.get(c.ANNOTATION_VOLCANO_QUEUE_NAME)
    if queue is not None:
        spec["queue"] = queue
    priority_class = None
    for pod_set in ctx.info.pod_sets:
        value = pod_set.pod_spec.get("priorityClassName")
        if value:
            priority_class = value
    if priority_class:
        spec["priorityClassName"] = priority_class
    topology = policy.get("networkTopology")
    if isinstance(topology, dict):
        spec["networkTopology"] = {"mode": topology.get("mode", "hard"),
                                   "highestTierAllowed": topology.get("highestTierAllowed", 1)}
    return [{"apiVersion": c.VOLCANO_API_VERSION, "kind": c.POD_GROUP_KIND,
             "metadata": podgroup.metadata(ctx), "spec": spec}]


def validate(ctx: ValidationContext) -> Verdict:
    verdict = Verdict()
    if ctx.info is None or _policy(ctx.info.pod_group_policy) is None:
        return verdict
    queue_key = c.ANNOTATION_VOLCANO_QUEUE_NAME
    if ctx.info.annotations.get(queue_key) == "":
        verdict.errors.append(invalid(f"spec.annotations[{queue_key}]", "", c.ERR_VOLCANO_EMPTY_QUEUE))
    for job in items(ctx.info.jobset_spec.get("replicatedJobs")):
        priority_class = dig(job, "template", "spec", "template", "spec", "priorityClassName")
        if not priority_class:
            continue
        if priority_class in _SYSTEM_PRIORITY_CLASSES:
            break  # upstream stops checking entirely here
        try:
            found = ctx.observed.get(c.PRIORITY_CLASS_API_VERSION, "PriorityClass", "", priority_class)
            api_error = None if found is not None else not_found_text(
                c.PRIORITY_CLASS_API_VERSION, "PriorityClass", priority_class)
        except ReadError as err:
            api_error = str(err)
        if api_error is not None:
            verdict.errors.append(invalid("spec.templateSpec.priorityClassName", priority_class,
                                          f'PriorityClass "{priority_class}" doesn\'t exist: {api_error}'))
    return verdict


PLUGIN = Plugin(name="Volcano", enforce_pod_group_policy=enforce_pod_group_policy, build=build,
                validate=validate,
                children=(ChildKind("scheduling.volcano.sh/v1beta1", "PodGroup"),))
