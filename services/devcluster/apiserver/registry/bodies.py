"""What decoding a request body checks before any stage runs: kind and apiVersion against the
endpoint, metadata field types, and the name and namespace against the URL (kube-apiserver's
decoding and its rest.BeforeCreate/BeforeUpdate identity checks)."""
from __future__ import annotations

import json
from typing import Any

from .. import errors
from ..registry.kinds import ResourceType


def check_body(rt: ResourceType, body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise errors.bad_request(f"the body of a {rt.kind} must be a JSON object")
    obj = body  # callers pass freshly decoded bodies they no longer use
    if rt.builtin:
        # built-in decoding defaults the group/version/kind from the endpoint, as upstream
        obj.setdefault("apiVersion", rt.api_version)
        obj.setdefault("kind", rt.kind)
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    for field_name, value in (("apiVersion", api_version), ("kind", kind)):
        if value is not None and not isinstance(value, str):
            raise errors.bad_request(f"{field_name}: must be a string, got {json.dumps(value)[:100]}")
    if not kind:
        raise errors.bad_request("Object 'Kind' is missing in the request body")
    if not api_version:
        raise errors.bad_request("Object 'apiVersion' is missing in the request body")
    if kind != rt.kind or (api_version != rt.api_version and api_version not in _accepted_versions(rt)):
        raise errors.bad_request(
            f"the API version in the data ({api_version}) does not match the expected API version "
            f"({rt.api_version})" if kind == rt.kind else
            f"the kind in the data ({kind}) does not match the expected kind ({rt.kind}) for {rt.qualified_resource}")
    obj["apiVersion"] = rt.api_version
    if not isinstance(obj.get("metadata", {}), dict):
        raise errors.bad_request("metadata must be a JSON object")
    for key in ("name", "generateName", "namespace", "resourceVersion", "uid"):
        value = (obj.get("metadata") or {}).get(key)
        if value is not None and not isinstance(value, str):
            raise errors.bad_request(f"metadata.{key}: must be a string, got {json.dumps(value)[:100]}")
    obj.setdefault("metadata", {})
    return obj

def _accepted_versions(rt: ResourceType) -> set[str]:
    return {f"{rt.group}/{v}" if rt.group else v for v in rt.served_versions}

def place_namespace(rt: ResourceType, namespace: str | None, meta: dict[str, Any]) -> None:
    if rt.namespaced:
        body_ns = meta.get("namespace")
        if body_ns and namespace and body_ns != namespace:
            raise errors.bad_request(
                "the namespace of the provided object does not match the namespace sent on the request")
        meta["namespace"] = namespace or body_ns or "default"
    else:
        meta.pop("namespace", None)

def check_identity(rt: ResourceType, namespace: str | None, name: str, meta: dict[str, Any],
                    patched_kind: str | None = None) -> None:
    body_name = meta.get("name")
    if body_name and body_name != name:
        raise errors.bad_request(f"the name of the object ({body_name}) does not match the name on the URL ({name})")
    meta["name"] = name
    if rt.namespaced:
        body_ns = meta.get("namespace")
        if body_ns and body_ns != namespace:
            raise errors.bad_request(
                "the namespace of the provided object does not match the namespace sent on the request")
        meta["namespace"] = namespace
    else:
        meta.pop("namespace", None)
