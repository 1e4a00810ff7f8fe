"""What both gang-scheduling plugins compute: member count and summed requests."""
from __future__ import annotations

from typing import Any

from ..errors import PlanningError
from ..framework import PlanContext
from ..observed import ReadError
from trainyard.apimachinery.quantity import render_quantity
from ..resources import Requests


def gang_count(pod_set: Any) -> int:
    """Pods of a PodSet the gang waits for: an elastic trainer's minNodes, else its count."""
    return pod_set.min_count if pod_set.min_count is not None else pod_set.count


def min_member(ctx: PlanContext) -> int:
    return sum(gang_count(pod_set) for pod_set in ctx.info.pod_sets)


def min_resources(ctx: PlanContext) -> dict[str, str]:
    """Per resource, the sum over PodSets of one pod's requests times the pod count."""
    total: Requests = {}
    for pod_set in ctx.info.pod_sets:
        for name, quantity in pod_set.single_pod_requests.items():
            scaled = quantity.times(gang_count(pod_set))
            total[name] = total[name] + scaled if name in total else scaled
    return {name: render_quantity(quantity) for name, quantity in total.items()}


def should_emit(ctx: PlanContext, api_version: str) -> bool:
    """Emit when the PodGroup is absent or the TrainJob is suspended (spec §4.7 step 2)."""
    try:
        existing = ctx.observed.get(api_version, "PodGroup", ctx.namespace, ctx.name)
    except ReadError as err:
        raise PlanningError(str(err)) from None
    return existing is None or ctx.spec.get("suspend") is True


def metadata(ctx: PlanContext) -> dict[str, Any]:
    return {"name": ctx.name, "namespace": ctx.namespace, "ownerReferences": [ctx.owner_reference()]}
