"""Definitions several plugins share (spec §4.1.1)."""
from __future__ import annotations

from trainyard.api import constants as c

from typing import Any

from ..documents import dig, mapping
from ..info import RuntimeInfo


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def master_address(trainjob_name: str) -> str:
    # Always the literal job name "node" and the TrainJob name as subdomain (upstream).
    return f"{trainjob_name}-{c.NODE}-0-0.{trainjob_name}"


def runtime_resources_per_node(info: RuntimeInfo) -> dict[str, Any] | None:
    """Resources of the first container ``node`` in the first job named ``node`` or
    labeled ancestor ``trainer`` (override-merged template), limits and requests only."""
    for pod_set in info.pod_sets:
        if pod_set.name != c.NODE and pod_set.ancestor != c.ANCESTOR_TRAINER:
            continue
        container = pod_set.container(c.NODE)
        if container is None:
            continue
        resources = mapping(container.get("resources"))
        return {k: resources[k] for k in ("limits", "requests") if k in resources}
    return None


def effective_resources_per_node(trainjob: dict[str, Any], info: RuntimeInfo) -> dict[str, Any] | None:
    trainer = dig(trainjob, "spec", "trainer")
    if isinstance(trainer, dict) and "resourcesPerNode" in trainer and trainer["resourcesPerNode"] is not None:
        return mapping(trainer["resourcesPerNode"])
    return runtime_resources_per_node(info)


