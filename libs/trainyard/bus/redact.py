"""What of a Kubernetes object may go on the bus: a Secret's contents never do.

Streams and KV buckets are persisted on the NATS servers' disks and readable by every
identity granted the subject, so the watcher publishes a Secret as a reference: its metadata,
type and immutability, the names of its keys, and a SHA-256 digest of its data (to tell a
change), never the values. ``kubectl.kubernetes.io/last-applied-configuration``, which
holds a copy of the whole object, goes too. Whoever needs a Secret's data reads it from the
API server (docs/security.md).
"""
from __future__ import annotations

import hashlib
import json
from copy import deepcopy
from typing import Any

DATA_DIGEST_ANNOTATION = "trainyard.kubeflow.org/data-sha256"
DATA_KEYS_ANNOTATION = "trainyard.kubeflow.org/data-keys"
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def is_secret(obj: dict[str, Any]) -> bool:
    return obj.get("kind") == "Secret" and obj.get("apiVersion") == "v1"


def data_digest(obj: dict[str, Any]) -> str:
    """SHA-256 of the Secret's data and stringData (canonical JSON)."""
    payload = {"data": obj.get("data") or {}, "stringData": obj.get("stringData") or {}}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def redact(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` as it may be published: unchanged unless it is a Secret."""
    if not is_secret(obj):
        return obj
    out = {k: deepcopy(v) for k, v in obj.items() if k not in ("data", "stringData")}
    meta = out.setdefault("metadata", {})
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k != LAST_APPLIED}
    keys = sorted({*(obj.get("data") or {}), *(obj.get("stringData") or {})})
    annotations[DATA_KEYS_ANNOTATION] = ",".join(keys)
    annotations[DATA_DIGEST_ANNOTATION] = data_digest(obj)
    meta["annotations"] = annotations
    return out
