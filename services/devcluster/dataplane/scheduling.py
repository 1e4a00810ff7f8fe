"""The single-node scheduler's decision: which pending pods bind now (pure).

Pods fit when their requests fit the node's allocatable minus what bound, non-terminal pods
request. Gang members (a ``scheduling.x-k8s.io`` PodGroup named by the pod label
``scheduling.x-k8s.io/pod-group``, or a Volcano PodGroup named by the annotation
``scheduling.k8s.io/group-name`` on pods with ``schedulerName: volcano``) bind all together
or not at all: only when already-bound members plus members that fit now reach ``minMember``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from trainyard.apimachinery.quantity import QuantityError, millicores, whole_units

COSCHEDULING_LABEL = "scheduling.x-k8s.io/pod-group"
VOLCANO_ANNOTATION = "scheduling.k8s.io/group-name"
VOLCANO_SCHEDULER = "volcano"
GPU = "nvidia.com/gpu"


@dataclass(frozen=True)
class GangKey:
    kind: str  # "coscheduling" | "volcano"
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass
class Decision:
    bind: list[str] = field(default_factory=list)           # pod keys "ns/name", in order
    unschedulable: dict[str, tuple[str, str]] = field(default_factory=dict)  # key -> (reason, message)


def pod_key(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', 'default')}/{meta.get('name', '')}"


def _amount(resource: str, value: Any) -> int:
    return millicores(value) if resource == "cpu" else whole_units(value)


def pod_requests(pod: Mapping[str, Any]) -> dict[str, int]:
    """Effective requests: the sum over containers, or the largest init container if bigger.

    A container with a limit but no request requests its limit (API-server defaulting).
    CPU is in millicores; every other resource in whole units.
    """
    spec = pod.get("spec") or {}

    def of(container: Mapping[str, Any]) -> dict[str, int]:
        resources = container.get("resources") or {}
        merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        return {name: _amount(name, value) for name, value in merged.items()}

    total: dict[str, int] = {}
    for container in spec.get("containers") or []:
        for name, value in of(container).items():
            total[name] = total.get(name, 0) + value
    for container in spec.get("initContainers") or []:
        for name, value in of(container).items():
            total[name] = max(total.get(name, 0), value)
    total["pods"] = 1
    return total


def gang_of(pod: Mapping[str, Any]) -> GangKey | None:
    meta = pod.get("metadata") or {}
    namespace = meta.get("namespace", "default")
    group = (meta.get("labels") or {}).get(COSCHEDULING_LABEL)
    if group:
        return GangKey("coscheduling", namespace, group)
    if (pod.get("spec") or {}).get("schedulerName") == VOLCANO_SCHEDULER:
        group = (meta.get("annotations") or {}).get(VOLCANO_ANNOTATION)
        if group:
            return GangKey("volcano", namespace, group)
    return None


def is_terminal(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def _fits(requests: Mapping[str, int], free: Mapping[str, int]) -> list[str]:
    """The resources a pod lacks (empty when it fits)."""
    return sorted(name for name, amount in requests.items()
                  if amount > 0 and amount > free.get(name, 0))


def _insufficient(missing: list[str]) -> str:
    return "0/1 nodes are available: " + ", ".join(f"1 Insufficient {name}" for name in missing) + "."


SELECTOR_MISMATCH = "0/1 nodes are available: 1 node(s) didn't match Node's node affinity/selector."


def selector_matches(pod: Mapping[str, Any], node_labels: Mapping[str, str]) -> bool:
    """``spec.nodeSelector``: every key present on the node with the same value."""
    selector = (pod.get("spec") or {}).get("nodeSelector") or {}
    return all(node_labels.get(key) == value for key, value in selector.items())


def _place_gang(gang: GangKey, members: list[Mapping[str, Any]], needed: int, already: int,
                free: dict[str, int], decision: Decision) -> dict[str, int]:
    """Binds a gang's pending members that fit, all of them or none: only when they and the ones
    already bound reach ``needed`` (its PodGroup's minMember). Returns what is left free."""
    tentative = dict(free)
    fitting: list[str] = []
    missing_any: set[str] = set()
    for member in members:
        try:
            requests = pod_requests(member)
        except QuantityError:
            continue
        missing = _fits(requests, tentative)
        if missing:
            missing_any.update(missing)
            continue
        for name, amount in requests.items():
            tentative[name] = tentative.get(name, 0) - amount
        fitting.append(pod_key(member))
    if already + len(fitting) >= needed:
        decision.bind.extend(fitting)
        for member in members:
            if pod_key(member) not in fitting:
                decision.unschedulable[pod_key(member)] = (
                    "Unschedulable", _insufficient(sorted(missing_any) or ["pods"]))
        return tentative
    message = (f'0/1 nodes are available: pod group "{gang}" needs {needed} pods '
               f"scheduled together; {already} bound, {len(fitting)} of "
               f"{len(members)} pending fit")
    if missing_any:
        message += " (" + ", ".join(f"Insufficient {m}" for m in sorted(missing_any)) + ")"
    message += "."
    for member in members:
        decision.unschedulable[pod_key(member)] = ("Unschedulable", message)
    return free


def schedule(allocatable: Mapping[str, int], bound: Iterable[Mapping[str, Any]],
             pending: Iterable[Mapping[str, Any]],
             gang_min_members: Mapping[GangKey, int],
             node_labels: Mapping[str, str] | None = None) -> Decision:
    """Decide bindings for ``pending`` pods (oldest first) given already ``bound`` pods.

    ``gang_min_members`` holds each existing PodGroup's ``minMember``; a gang pod whose
    PodGroup does not exist yet waits. With ``node_labels``, a pod whose ``nodeSelector``
    the node does not satisfy stays pending (a gang member counts as not fitting).
    """
    free = dict(allocatable)
    bound_members: dict[GangKey, int] = {}
    for pod in bound:
        if is_terminal(pod):
            continue
        try:
            for name, amount in pod_requests(pod).items():
                free[name] = free.get(name, 0) - amount
        except QuantityError:
            continue
        gang = gang_of(pod)
        if gang is not None:
            bound_members[gang] = bound_members.get(gang, 0) + 1

    decision = Decision()
    ordered = sorted(pending, key=lambda p: ((p.get("metadata") or {}).get("creationTimestamp") or "",
                                             pod_key(p)))
    gangs: dict[GangKey, list[Mapping[str, Any]]] = {}
    singles: list[Mapping[str, Any]] = []
    for pod in ordered:
        if (pod.get("spec") or {}).get("schedulingGates"):
            decision.unschedulable[pod_key(pod)] = (
                "SchedulingGated", "Scheduling is blocked due to non-empty scheduling gates")
            continue
        if node_labels is not None and not selector_matches(pod, node_labels):
            decision.unschedulable[pod_key(pod)] = ("Unschedulable", SELECTOR_MISMATCH)
            continue
        gang = gang_of(pod)
        if gang is None:
            singles.append(pod)
        else:
            gangs.setdefault(gang, []).append(pod)

    # Walk pods in age order; a gang is decided as one unit when its oldest member comes up.
    decided: set[GangKey] = set()
    for pod in ordered:
        key = pod_key(pod)
        if key in decision.unschedulable:
            continue
        gang = gang_of(pod)
        if gang is None:
            try:
                requests = pod_requests(pod)
            except QuantityError as err:
                decision.unschedulable[key] = ("Unschedulable", f"invalid resource request: {err}")
                continue
            missing = _fits(requests, free)
            if missing:
                decision.unschedulable[key] = ("Unschedulable", _insufficient(missing))
                continue
            for name, amount in requests.items():
                free[name] = free.get(name, 0) - amount
            decision.bind.append(key)
            continue
        if gang in decided:
            continue
        decided.add(gang)
        members = gangs[gang]
        if gang not in gang_min_members:
            message = f'0/1 nodes are available: pod group "{gang}" not found.'
            for member in members:
                decision.unschedulable[pod_key(member)] = ("Unschedulable", message)
            continue
        free = _place_gang(gang, members, gang_min_members[gang], bound_members.get(gang, 0), free, decision)
    return decision


def node_allocatable(capacity: Mapping[str, Any]) -> dict[str, int]:
    """A Node's ``status.allocatable`` map in the scheduler's units."""
    out = {}
    for name, value in capacity.items():
        try:
            out[name] = _amount(name, value)
        except QuantityError:
            continue
    return out
