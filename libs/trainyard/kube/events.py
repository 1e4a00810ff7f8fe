"""Kubernetes Events (core/v1) recorded on an object, like client-go's event recorder."""
from __future__ import annotations

import logging
import uuid

from trainyard.clock import now_rfc3339
from trainyard.errortext import describe
from trainyard.kube.client import KubeClient, KubeError
from trainyard.kube.resources import EVENT

log = logging.getLogger(__name__)


def build_event(obj: dict, event_type: str, reason: str, message: str, component: str) -> dict:
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace") or "default"
    now = now_rfc3339()
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{meta.get('name')}.{uuid.uuid4().hex[:16]}", "namespace": namespace},
        "involvedObject": {
            "apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"),
            "name": meta.get("name"), "namespace": meta.get("namespace"),
            "uid": meta.get("uid"), "resourceVersion": meta.get("resourceVersion"),
        },
        "reason": reason,
        "message": message,
        "type": event_type,
        "source": {"component": component},
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
        "reportingComponent": component,
    }


async def record_event(client: KubeClient, obj: dict, event_type: str, reason: str,
                       message: str, component: str) -> None:
    """Best effort, as in Kubernetes: a failed event write is logged, never raised."""
    event = build_event(obj, event_type, reason, message, component)
    try:
        await client.create(EVENT, event["metadata"]["namespace"], event)
    except KubeError as err:
        log.warning("event not recorded: %s", describe(err), extra={"reason": reason})
