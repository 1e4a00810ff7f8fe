"""Resource arithmetic the plugins share (spec §3.4 step 5 and §4.1.1)."""
from __future__ import annotations

from typing import Any, Mapping

from trainyard.apimachinery.quantity import Quantity, parse_quantity

Requests = dict[str, Quantity]


def _requests_of(resources: Any) -> Requests:
    if not isinstance(resources, dict):
        return {}
    requests = resources.get("requests")
    if not isinstance(requests, dict):
        return {}
    return {name: parse_quantity(value) for name, value in requests.items()}


def _add(total: Requests, more: Requests) -> None:
    for name, quantity in more.items():
        total[name] = total[name] + quantity if name in total else quantity


def _maximum(total: Requests, other: Requests) -> None:
    for name, quantity in other.items():
        if name not in total or quantity.value > total[name].value:
            total[name] = quantity


def single_pod_requests(pod_spec: Mapping[str, Any]) -> Requests:
    """Effective requests of one Pod, with Kubernetes' standard rules.

    Regular containers' requests are summed (limits are not a fallback); sidecar init
    containers (``restartPolicy: Always``) add up as well, and the result is compared per
    resource with each regular init container plus the sidecars started before it, taking
    the maximum; then ``overhead`` is added; pod-level ``resources.requests`` win for the
    resources they name.
    """
    total: Requests = {}
    for container in pod_spec.get("containers") or []:
        _add(total, _requests_of(container.get("resources")))
    sidecars: Requests = {}
    init_peak: Requests = {}
    for container in pod_spec.get("initContainers") or []:
        requests = _requests_of(container.get("resources"))
        if container.get("restartPolicy") == "Always":
            _add(sidecars, requests)
            _maximum(init_peak, dict(sidecars))
        else:
            candidate = dict(sidecars)
            _add(candidate, requests)
            _maximum(init_peak, candidate)
    _add(total, sidecars)
    _maximum(total, init_peak)
    overhead = pod_spec.get("overhead")
    if isinstance(overhead, dict):
        _add(total, {name: parse_quantity(v) for name, v in overhead.items()})
    pod_requests = _requests_of(pod_spec.get("resources"))
    total.update(pod_requests)
    return total


def gpu_count(resources: Mapping[str, Any] | None) -> int:
    """GPU count of a resources block: first gpu-named request, else a gpu-named limit."""
    if not isinstance(resources, dict):
        return 0
    count = 0
    requests = resources.get("requests")
    if isinstance(requests, dict):
        for name, value in requests.items():
            if "gpu" in str(name).lower():
                count = parse_quantity(value).ceil()
                break
    if count == 0:
        limits = resources.get("limits")
        if isinstance(limits, dict):
            for name, value in limits.items():
                if "gpu" in str(name).lower():
                    limit = parse_quantity(value).ceil()
                    if limit > 0:
                        count = limit
                    break
    return count


def cpu_count(resources: Mapping[str, Any] | None) -> int:
    """CPU count: requests.cpu unless absent or zero, then limits.cpu; rounded up."""
    if not isinstance(resources, dict):
        return 0
    for section in ("requests", "limits"):
        block = resources.get(section)
        if isinstance(block, dict) and block.get("cpu") is not None:
            quantity = parse_quantity(block["cpu"])
            if quantity.value != 0:
                return quantity.ceil()
    return 0
