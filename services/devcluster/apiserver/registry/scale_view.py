"""The ``autoscaling/v1`` ``Scale`` view of a custom resource whose CRD version declares
``subresources.scale`` (pure): the Scale built from the object (``spec.replicas`` from the spec
path, ``status.replicas`` from the status path, 0 when absent, ``status.selector`` from the
selector path), the object with new replicas, the checks of the replicas paths, and the
managedFields between the object and its Scale. The registry checks and admission use it; the
``scale`` subresource (subresources/scale.py) serves it."""
from __future__ import annotations

import copy
from typing import Any

from trainyard.apimachinery.json_types import json_type_name

from .. import errors
from .kinds import ResourceType

SCALE_API_VERSION = "autoscaling/v1"
SCALE_KIND = "Scale"
SCALE_GVK = {"group": "autoscaling", "version": "v1", "kind": "Scale"}
SCALE_DEFINITION = "io.k8s.api.autoscaling.v1.Scale"
MAX_INT32 = 2**31 - 1
# kube-apiserver marks "the object had no value at the spec path" with the smallest int32: a
# Scale write that leaves it there is refused (an absent value cannot be scaled implicitly).
UNSET_REPLICAS = -(2**31)


def _go_value(value: Any) -> str:
    """A JSON value as Go's ``%v`` prints it in unstructured accessor errors."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "map[" + " ".join(f"{k}:{_go_value(v)}" for k, v in sorted(value.items())) + "]"
    if isinstance(value, list):
        return "[" + " ".join(_go_value(v) for v in value) + "]"
    return str(value)


# JSON types as Go's ``%T`` prints them in unstructured content.
_GO_TYPES = {"boolean": "bool", "integer": "int64", "number": "float64", "string": "string",
             "object": "map[string]interface {}"}


def _go_type(value: Any) -> str:
    return _GO_TYPES.get(json_type_name(value), "[]interface {}")


def accessor_error(path: str, value: Any, expected: str) -> str:
    """k8s.io/apimachinery's unstructured accessor error, e.g. ``.spec.x accessor error: two is
    of the type string, expected int64``."""
    return f"{path} accessor error: {_go_value(value)} is of the type {_go_type(value)}, expected {expected}"


class ScaleError(Exception):
    """A value at a scale path has the wrong type (kube-apiserver answers 400)."""


def field_path(path: str) -> list[str]:
    """``.spec.trainer.numNodes`` -> ``["spec", "trainer", "numNodes"]``."""
    return path[1:].split(".") if path.startswith(".") else path.split(".")


def _nested(obj: dict[str, Any], path: str) -> tuple[Any, bool]:
    current: Any = obj
    for part in field_path(path):
        if not isinstance(current, dict) or part not in current:
            return None, False
        current = current[part]
    return current, current is not None


def _nested_int(obj: dict[str, Any], path: str) -> tuple[int, bool]:
    value, found = _nested(obj, path)
    if not found:
        return 0, False
    if isinstance(value, bool) or not isinstance(value, int):
        raise ScaleError(accessor_error(path, value, "int64"))
    return value, True


def scale_of(obj: dict[str, Any], config: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """(the object's Scale, whether the object has a value at the spec replicas path)."""
    spec_replicas, found = _nested_int(obj, config.get("specReplicasPath") or "")
    status_replicas, _ = _nested_int(obj, config.get("statusReplicasPath") or "")
    selector = ""
    if config.get("labelSelectorPath"):
        value, present = _nested(obj, config["labelSelectorPath"])
        if present:
            if not isinstance(value, str):
                raise ScaleError(accessor_error(config["labelSelectorPath"], value, "string"))
            selector = value
    meta = obj.get("metadata") or {}
    scale_meta: dict[str, Any] = {"name": meta.get("name", "")}
    if meta.get("namespace"):
        scale_meta["namespace"] = meta["namespace"]
    for key in ("uid", "resourceVersion", "creationTimestamp"):
        if meta.get(key) is not None:
            scale_meta[key] = meta[key]
    status: dict[str, Any] = {"replicas": status_replicas}
    if selector:
        status["selector"] = selector
    # Go's autoscaling/v1 ScaleSpec drops replicas: 0 (omitempty); status.replicas is always there.
    return {"kind": SCALE_KIND, "apiVersion": SCALE_API_VERSION, "metadata": scale_meta,
            "spec": {"replicas": spec_replicas} if spec_replicas else {}, "status": status}, found


def with_replicas(obj: dict[str, Any], config: dict[str, Any], replicas: int) -> dict[str, Any]:
    """A copy of ``obj`` with ``replicas`` at the spec replicas path (intermediate maps created)."""
    out = copy.deepcopy(obj)
    current = out
    parts = field_path(config.get("specReplicasPath") or "")
    for part in parts[:-1]:
        nxt = current.get(part)
        if not isinstance(nxt, dict):
            nxt = current[part] = {}
        current = nxt
    current[parts[-1]] = replicas
    return out


def replicas_causes(obj: dict[str, Any], config: dict[str, Any], status: bool = False) -> list[dict[str, str]]:
    """kube-apiserver's checks of the values at the scale paths, on every write of the object:
    the spec replicas (and, for status writes, the status replicas) must be integers in
    [0, 2147483647]; the label selector must be a string."""
    causes: list[dict[str, str]] = []
    paths = [config.get("specReplicasPath") or ""]
    if status:
        paths.append(config.get("statusReplicasPath") or "")
    for path in paths:
        value, found = _nested(obj, path)
        if not found:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            causes.append(errors.field_cause(path, "FieldValueInvalid",
                                             f"Invalid value: 0: {accessor_error(path, value, 'int64')}"))
        elif value < 0:
            causes.append(errors.field_cause(path, "FieldValueInvalid",
                                             f"Invalid value: {value}: should be a non-negative integer"))
        elif value > MAX_INT32:
            causes.append(errors.field_cause(path, "FieldValueInvalid",
                                             f"Invalid value: {value}: should be less than or equal to {MAX_INT32}"))
    if status and config.get("labelSelectorPath"):
        path = config["labelSelectorPath"]
        value, found = _nested(obj, path)
        if found and not isinstance(value, str):
            causes.append(errors.field_cause(path, "FieldValueInvalid",
                                             f"Invalid value: \"\": {accessor_error(path, value, 'string')}"))
    return causes


def scale_or_400(obj: dict[str, Any], config: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    try:
        return scale_of(obj, config)
    except ScaleError as err:
        raise errors.bad_request(str(err)) from err


class ScaleType:
    """Enough of a resource type for the built-in field checks and Server-Side Apply of a Scale."""

    builtin = True
    definition = SCALE_DEFINITION
    schema = None
    has_status = True  # an applied Scale's status is not the client's to set


# -- managedFields between the object and its Scale (kube-apiserver's ScaleHandler) -----------
_SCALE_REPLICAS = ["spec", "replicas"]


def _owns(fields: dict[str, Any], parts: list[str]) -> bool:
    node: Any = fields
    for part in parts:
        if not isinstance(node, dict) or f"f:{part}" not in node:
            return False
        node = node[f"f:{part}"]
    return True


def _without(fields: dict[str, Any], parts: list[str]) -> dict[str, Any]:
    """``fields`` (FieldsV1) without the leaf at ``parts``; maps left empty are dropped."""
    if not parts or f"f:{parts[0]}" not in fields:
        return fields
    out = dict(fields)
    key = f"f:{parts[0]}"
    if len(parts) == 1:
        del out[key]
    else:
        child = _without(out[key], parts[1:]) if isinstance(out[key], dict) else out[key]
        if child:
            out[key] = child
        else:
            del out[key]
    return out


def _with(fields: dict[str, Any], parts: list[str]) -> dict[str, Any]:
    out = dict(fields)
    node = out
    for part in parts[:-1]:
        node[f"f:{part}"] = dict(node.get(f"f:{part}") or {})
        node = node[f"f:{part}"]
    node.setdefault(f"f:{parts[-1]}", {})
    return out


def _identity(entry: dict[str, Any]) -> tuple[str, str, str]:
    return entry.get("manager", ""), entry.get("operation", ""), entry.get("subresource", "")


def scale_managed_fields(entries: list[dict[str, Any]], config: dict[str, Any]) -> list[dict[str, Any]]:
    """The object's managedFields seen through its Scale: the managers owning the spec replicas
    path own ``spec.replicas`` (kube-apiserver converts them the same way for an apply)."""
    parts = field_path(config.get("specReplicasPath") or "")
    out = []
    for entry in entries or []:
        if _owns(entry.get("fieldsV1") or {}, parts):
            converted = dict(entry, apiVersion=SCALE_API_VERSION, fieldsType="FieldsV1",
                             fieldsV1=_with({}, _SCALE_REPLICAS))
            out.append(converted)
    return out


def parent_managed_fields(entries: list[dict[str, Any]], scale_entries: list[dict[str, Any]],
                          config: dict[str, Any], api_version: str) -> list[dict[str, Any]]:
    """The object's managedFields after a Scale apply: the managers that own ``spec.replicas`` in
    the Scale's entries own the spec replicas path, nobody else does; a manager new to it gets
    an entry with subresource ``scale``."""
    parts = field_path(config.get("specReplicasPath") or "")
    owners = {_identity(e): e for e in scale_entries if _owns(e.get("fieldsV1") or {}, _SCALE_REPLICAS)}
    out = []
    for entry in entries or []:
        fields = entry.get("fieldsV1") or {}
        if _identity(entry) in owners:
            owners.pop(_identity(entry))
            out.append(dict(entry, fieldsV1=_with(fields, parts)))
            continue
        trimmed = _without(fields, parts)
        if trimmed:
            out.append(dict(entry, fieldsV1=trimmed))
    for entry in owners.values():
        added = {"manager": entry.get("manager", ""), "operation": entry.get("operation", ""),
                 "apiVersion": api_version}
        if entry.get("time"):
            added["time"] = entry["time"]
        added.update(fieldsType="FieldsV1", fieldsV1=_with({}, parts), subresource="scale")
        out.append(added)
    return out




def scale_views(rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None
                ) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The new and old object of a scale write as admission sees them: autoscaling/v1 Scales
    (``kind`` Scale, subresource ``scale``), as kube-apiserver sends them."""
    config = rt.scale or {}
    return scale_or_400(obj, config)[0], (scale_or_400(old, config)[0] if old is not None else None)
