"""CoScheduling: scheduler-plugins PodGroup and the pod-group Pod label (spec §4.7)."""
from __future__ import annotations

from trainyard.api import constants as c

from typing import Any

from ..documents import mapping
from ..framework import ChildKind, PlanContext, Plugin
from . import podgroup


def _policy(ctx: PlanContext) -> dict[str, Any] | None:
    policy = mapping(ctx.info.pod_group_policy).get("coscheduling")
    return policy if isinstance(policy, dict) else None


def enforce_pod_group_policy(ctx: PlanContext) -> None:
    if _policy(ctx) is not None:
        ctx.info.pod_labels[c.LABEL_COSCHEDULING_POD_GROUP] = ctx.name


def build(ctx: PlanContext) -> list[dict[str, Any]]:
    policy = _policy(ctx)
    if policy is None or not podgroup.should_emit(ctx, c.COSCHEDULING_API_VERSION):
        return []
    return [{
        "apiVersion": c.COSCHEDULING_API_VERSION,
        "kind": c.POD_GROUP_KIND,
        "metadata": podgroup.metadata(ctx),
        "spec": {
            "minMember": podgroup.min_member(ctx),
            "minResources": podgroup.min_resources(ctx),
            "scheduleTimeoutSeconds": policy.get("scheduleTimeoutSeconds", c.DEFAULT_SCHEDULE_TIMEOUT_SECONDS),
        },
    }]


PLUGIN = Plugin(name="CoScheduling", enforce_pod_group_policy=enforce_pod_group_policy, build=build,
                children=(ChildKind("scheduling.x-k8s.io/v1alpha1", "PodGroup"),))
