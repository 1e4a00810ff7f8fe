"""The server's bridge to ``trainyard.apimachinery``: patches, selectors, managedFields, protobuf.

The pure algorithms live in the library; this module maps their errors onto ``Status`` answers
and picks the schema (built-in definition or CRD structural schema) for a resource type.
"""
from __future__ import annotations

import importlib
import json
from typing import Any, Callable

from . import errors
from .errors import ApiError
from .registry import ResourceType
from .storage import StoredObject

CR_PATCH_TYPES = ["application/json-patch+json", "application/merge-patch+json", "application/apply-patch+yaml"]
BUILTIN_PATCH_TYPES = CR_PATCH_TYPES + ["application/strategic-merge-patch+json"]


def _lib(name: str) -> Any:
    """Import ``trainyard.apimachinery.<name>``; a clear 500 while a part has not landed."""
    try:
        return importlib.import_module(f"trainyard.apimachinery.{name}")
    except ImportError as err:
        raise errors.internal(f"trainyard.apimachinery.{name} is not available: {err}") from err


def _machinery_error(err: Exception) -> ApiError:
    from trainyard.apimachinery.errors import PatchError, SelectorError, UnsupportedPatchType
    if isinstance(err, UnsupportedPatchType):
        return errors.unsupported_media_type(CR_PATCH_TYPES)
    if isinstance(err, SelectorError):
        return errors.bad_request(str(err))
    if isinstance(err, PatchError):
        return errors.bad_request(str(err))
    return errors.bad_request(str(err))


# ---------------------------------------------------------------- selectors

def label_matcher(selector: str) -> Callable[[dict[str, str]], bool]:
    if not selector or not selector.strip():
        return lambda labels: True
    selectors = _lib("selectors")
    try:
        parsed = selectors.parse_label_selector(selector)
    except ValueError as err:
        raise _machinery_error(err) from err
    return parsed.matches


_FIELDS_BY_RESOURCE: dict[tuple[str, str], set[str]] = {
    ("", "pods"): {"spec.nodeName", "status.phase", "spec.restartPolicy", "spec.schedulerName",
                   "spec.serviceAccountName", "status.podIP", "status.nominatedNodeName"},
    ("", "events"): {"involvedObject.kind", "involvedObject.name", "involvedObject.namespace", "involvedObject.uid",
                     "involvedObject.apiVersion", "involvedObject.resourceVersion", "involvedObject.fieldPath",
                     "reason", "type", "source", "reportingComponent"},
    ("", "secrets"): {"type"},
    ("", "namespaces"): {"status.phase"},
    ("", "nodes"): {"spec.unschedulable"},
    ("batch", "jobs"): {"status.successful"},
}


def _field_value(obj: dict[str, Any], key: str) -> str:
    if key == "source":
        return str((obj.get("source") or {}).get("component", ""))
    current: Any = obj
    for part in key.split("."):
        current = current.get(part) if isinstance(current, dict) else None
    if current is None:
        return ""
    if isinstance(current, bool):
        return "true" if current else "false"
    return str(current)


def field_matcher(rt: ResourceType, selector: str) -> Callable[[str, str, StoredObject], bool] | None:
    if not selector or not selector.strip():
        return None
    selectors = _lib("selectors")
    try:
        requirements = selectors.parse_field_selector(selector)
    except ValueError as err:
        raise _machinery_error(err) from err
    allowed = {"metadata.name", "metadata.namespace"} | _FIELDS_BY_RESOURCE.get(rt.storage_key, set())
    for req in requirements:
        if req.field not in allowed:
            raise errors.bad_request(f'field label not supported: {req.field}')

    def matches(namespace: str, name: str, stored: StoredObject) -> bool:
        obj: dict[str, Any] | None = None
        for req in requirements:
            if req.field == "metadata.name":
                value = name
            elif req.field == "metadata.namespace":
                value = namespace
            else:
                if obj is None:
                    obj = stored.load()
                value = _field_value(obj, req.field)
            if not req.matches(value):
                return False
        return True
    return matches


def fields_of(rt: ResourceType, obj: dict[str, Any]) -> dict[str, str]:
    """Field values a watch filters on (for the old/new comparison of a change)."""
    meta = obj.get("metadata") or {}
    values = {"metadata.name": meta.get("name", ""), "metadata.namespace": meta.get("namespace", "")}
    for key in _FIELDS_BY_RESOURCE.get(rt.storage_key, ()):
        values[key] = _field_value(obj, key)
    return values


# ---------------------------------------------------------------- patches

def _decode_json(body: bytes, what: str) -> Any:
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as err:
        raise errors.bad_request(f"error decoding {what}: {err}") from err


def apply_patch(rt: ResourceType, patch_type: str, old: dict[str, Any], body: bytes) -> dict[str, Any]:
    if patch_type == "merge":
        patch = _decode_json(body, "merge patch")
        if not isinstance(patch, dict):
            raise errors.bad_request("a merge patch must be a JSON object")
        return _lib("merge_patch").json_merge_patch(old, patch)
    if patch_type == "json":
        ops = _decode_json(body, "json patch")
        if not isinstance(ops, list):
            raise errors.bad_request("json: cannot unmarshal object into Go value of type []handlers.jsonPatchOp"
                                     if isinstance(ops, dict) else "a JSON patch must be a JSON array of operations")
        module = _lib("json_patch")
        try:
            return module.apply_json_patch(old, ops)
        except module.JsonPatchError as err:
            raise errors.ApiError(422, "Invalid", str(err)) from err
    if patch_type == "strategic":
        if not rt.builtin or not rt.definition:
            raise errors.unsupported_media_type(CR_PATCH_TYPES)
        patch = _decode_json(body, "strategic merge patch")
        if not isinstance(patch, dict):
            raise errors.bad_request("a strategic merge patch must be a JSON object")
        module = _lib("strategic_merge")
        try:
            return module.strategic_merge_patch(old, patch, rt.definition)
        except ValueError as err:
            raise _machinery_error(err) from err
    raise errors.unsupported_media_type(BUILTIN_PATCH_TYPES if rt.builtin else CR_PATCH_TYPES)


def parse_apply_body(body: bytes) -> dict[str, Any]:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as err:
        raise errors.bad_request(f"error decoding apply configuration: {err}") from err
    try:
        config = json.loads(text)
    except ValueError:
        import yaml
        try:
            config = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise errors.bad_request(f"error decoding YAML: {str(err).splitlines()[0]}") from err
    if not isinstance(config, dict):
        raise errors.bad_request("an apply configuration must be an object")
    return config


# ---------------------------------------------------------------- managedFields and apply

def _schema_for(rt: ResourceType) -> Any:
    defs = _lib("openapi_definitions")
    if rt.builtin and rt.definition and defs.has_definition(rt.definition):
        return defs.builtin_schema(rt.definition)
    return defs.structural_schema(rt.schema or {"type": "object", "x-kubernetes-preserve-unknown-fields": True})


def record_update(rt: ResourceType, old: dict[str, Any] | None, new: dict[str, Any], opts: Any, operation: str) -> None:
    """Set ``new.metadata.managedFields`` for a non-apply write (or an apply-create)."""
    try:
        ssa = importlib.import_module("trainyard.apimachinery.server_side_apply")
    except ImportError:
        return  # managedFields are recorded once the apply machinery is available
    try:
        ssa.record_write(
            schema=_schema_for(rt), live=old, updated=new, manager=opts.manager or "unknown",
            api_version=rt.api_version, subresource=opts.subresource, operation=operation)
    except ValueError as err:
        raise _machinery_error(err) from err


def server_side_apply(rt: ResourceType, live: dict[str, Any], config: dict[str, Any], opts: Any) -> dict[str, Any]:
    ssa = _lib("server_side_apply")
    try:
        return ssa.apply(schema=_schema_for(rt), live=live, config=config, manager=opts.manager,
                         api_version=rt.api_version, subresource=opts.subresource, force=opts.force)
    except ssa.ApplyConflict as err:
        raise errors.ApiError(409, "Conflict", str(err), {"causes": err.causes}) from err
    except ValueError as err:
        raise _machinery_error(err) from err


def check_builtin_fields(rt: ResourceType, obj: dict[str, Any], opts: Any) -> None:
    """Built-in kinds are stored as sent (no pruning); unknown fields are not reported yet."""
    return None


# ---------------------------------------------------------------- protobuf

def decode_protobuf(body: bytes) -> dict[str, Any]:
    module = _lib("protobuf")
    try:
        return module.decode_object(body)
    except ValueError as err:
        raise errors.bad_request(f"error decoding protobuf body: {err}") from err
