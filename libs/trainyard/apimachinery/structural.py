"""Structural-schema processing of custom resources, as the API server does it; pure.

``prune`` drops unknown fields (reported by path, for ``fieldValidation``), ``apply_defaults``
applies schema defaults, ``validate`` checks types, required fields, enums, bounds, patterns
and list-map keys and runs the ``x-kubernetes-validations`` rules through the one CEL
evaluator (``trainyard.apimachinery.cel``; transition rules on update only, list items
correlated by their map keys). Unchanged values are not re-validated on update (validation
ratcheting, as upstream since 1.30). Causes are ``{"reason", "message", "field"}`` with
Kubernetes' texts: the devcluster API server returns them as they are, ``trainyard validate``
turns them into field errors.
"""
from __future__ import annotations

import copy
import json
import re
from typing import Any, Callable, TypedDict

from .cel import CelError, compile_rule
from .json_types import json_type_name


class FieldCause(TypedDict):
    reason: str
    message: str
    field: str


def field_cause(field: str, reason: str, message: str) -> FieldCause:
    return {"reason": reason, "message": message, "field": field}


_META_FIELDS = {
    "name", "generateName", "namespace", "selfLink", "uid", "resourceVersion", "generation", "creationTimestamp",
    "deletionTimestamp", "deletionGracePeriodSeconds", "labels", "annotations", "ownerReferences", "finalizers",
    "managedFields",
}
_ROOT_FIELDS = {"apiVersion", "kind", "metadata"}
_MISSING = object()


def _path(parent: str, key: str) -> str:
    return f"{parent}.{key}" if parent else key


def normalise_numbers(value: Any) -> Any:
    """Whole-number floats become ints, as the API server's JSON decoding does (``2.0`` -> ``2``)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: normalise_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [normalise_numbers(v) for v in value]
    return value


class _Walk:
    def __init__(self, check: bool) -> None:
        self.unknown: list[str] = []
        self.causes: list[FieldCause] = []
        self.check = check


_NESTED = (dict, list)  # the values pruning descends into


def _prune(value: Any, schema: dict[str, Any], path: str, walk: _Walk, root: bool = False) -> Any:
    if not isinstance(schema, dict):
        return value
    if isinstance(value, dict):
        props = schema.get("properties")
        additional = schema.get("additionalProperties")
        preserve = schema.get("x-kubernetes-preserve-unknown-fields") is True
        embedded = schema.get("x-kubernetes-embedded-resource") is True
        out = {}
        for key, child in value.items():
            if (root or embedded) and key in _ROOT_FIELDS:
                if key == "metadata" and isinstance(child, dict):
                    out[key] = {k: v for k, v in child.items() if k in _META_FIELDS}
                    for k in child:
                        if k not in _META_FIELDS:
                            walk.unknown.append(_path(_path(path, "metadata"), k))
                else:
                    out[key] = child
                continue
            if props is not None and key in props:
                # a scalar is kept as it is, whatever its schema (no call, no path for it)
                out[key] = _prune(child, props[key], _path(path, key), walk) if isinstance(child, _NESTED) else child
            elif isinstance(additional, dict):
                out[key] = _prune(child, additional, _path(path, key), walk) if isinstance(child, _NESTED) else child
            elif additional is True or preserve:
                out[key] = child
            else:
                walk.unknown.append(_path(path, key))
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [_prune(item, schema["items"], f"{path}[{i}]", walk) for i, item in enumerate(value)]
    return value


_DEFAULTING: dict[int, tuple[dict[str, Any], dict[str, Any], list[tuple[str, Any]], Any]] = {}


def _defaulting(schema: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[str, Any]], Any]:
    """A map schema's properties, its properties with a default (in schema order) and its
    additionalProperties schema (None unless a map): computed once per schema node, not per
    object (PodSpec-sized schemas have dozens of properties, few of them defaulted)."""
    cached = _DEFAULTING.get(id(schema))
    if cached is None or cached[0] is not schema:
        if len(_DEFAULTING) > 100_000:
            _DEFAULTING.clear()
        props = schema.get("properties") or {}
        defaulted = [(key, child) for key, child in props.items() if isinstance(child, dict) and "default" in child]
        additional = schema.get("additionalProperties")
        cached = (schema, props, defaulted, additional if isinstance(additional, dict) else None)
        _DEFAULTING[id(schema)] = cached
    return cached[1], cached[2], cached[3]


def _default(value: Any, schema: dict[str, Any]) -> Any:
    if not isinstance(schema, dict):
        return value
    if isinstance(value, dict):
        props, defaulted, additional = _defaulting(schema)
        for key, child_schema in defaulted:  # absent fields get their defaults, in schema order
            if key not in value:
                value[key] = copy.deepcopy(child_schema["default"])
        for key, child in value.items():  # then every field is defaulted inside (scalars have nothing)
            if isinstance(child, (dict, list)):
                child_schema = props[key] if key in props else additional
                if child_schema is not None:
                    value[key] = _default(child, child_schema)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [_default(item, schema["items"]) for item in value]
    return value


def _type_ok(value: Any, schema: dict[str, Any]) -> bool:
    if schema.get("x-kubernetes-int-or-string"):
        return isinstance(value, (int, str)) and not isinstance(value, bool)
    expected = schema.get("type")
    if expected is None:
        return True
    actual = json_type_name(value)
    if expected == "number":
        return actual in ("number", "integer")
    return actual == expected


def _invalid_value(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return json.dumps(json_type_name(value))
    return json.dumps(value)


def _rule_field(path: str, rule_spec: dict[str, Any]) -> str:
    field_path = rule_spec.get("fieldPath")
    if not field_path:
        return path
    return path + field_path if field_path.startswith(".") else field_path


_RULE_REASONS = {"FieldValueForbidden", "FieldValueRequired", "FieldValueDuplicate"}


def _run_rules(value: Any, old: Any, schema: dict[str, Any], path: str, walk: _Walk) -> None:
    for rule_spec in schema.get("x-kubernetes-validations") or []:
        compiled = compile_rule(rule_spec.get("rule", ""))
        if compiled.transition and old is _MISSING:
            continue  # transition rules only run where an old value correlates
        field = _rule_field(path, rule_spec)
        try:
            ok = compiled.holds(value, old if compiled.transition else None)
        except CelError as err:
            walk.causes.append(field_cause(field, "FieldValueInvalid",
                                           f"Invalid value: {_invalid_value(value)}: rule evaluation error: {err}"))
            continue
        if not ok:
            message = rule_spec.get("message") or f"failed rule: {compiled.rule}"
            reason = rule_spec.get("reason", "")
            # The API server shows the value's type here, even for scalars (the CEL failure
            # names the schema type, never the value).
            walk.causes.append(field_cause(field, reason if reason in _RULE_REASONS else "FieldValueInvalid",
                                           f"Invalid value: {json.dumps(json_type_name(value))}: {message}"))


def _correlated(schema: dict[str, Any], old_items: list[Any]) -> Callable[[int, Any], Any]:
    """The old item a new list item is compared with (transition rules, ratcheting): in a
    ``map`` list the one with the same keys, as the API server correlates them (a patch of a new
    manager in ``runtimePatches`` is a new item, not a change of the first one); else the one at
    the same index."""
    if schema.get("x-kubernetes-list-type") != "map":
        return lambda i, _item: old_items[i] if i < len(old_items) else _MISSING
    keys = schema.get("x-kubernetes-list-map-keys") or []

    def key_of(item: Any) -> tuple[str, ...] | None:
        return tuple(json.dumps(item.get(k)) for k in keys) if isinstance(item, dict) else None

    by_key = {key_of(item): item for item in old_items if key_of(item) is not None}
    return lambda _i, item: by_key.get(key_of(item), _MISSING)


_SCALAR_CHECKS = ("enum", "minimum", "maximum", "maxLength", "minLength", "pattern", "allOf", "x-kubernetes-validations",
                  "x-kubernetes-int-or-string", "nullable")
_PLAIN_TYPES = {"string": (str,), "integer": (int,), "boolean": (bool,), "number": (int, float)}
_PLAIN: dict[int, tuple[Any, tuple[type, ...]]] = {}


def _plain(schema: Any) -> tuple[type, ...]:
    """The Python types of the scalars ``schema`` accepts with nothing else to check (a typed
    scalar without enum, bounds, lengths, pattern, rules): such a value is valid as it is, and
    ``_validate`` is not called for it. Empty for any other schema; computed once per node."""
    cached = _PLAIN.get(id(schema))
    if cached is None or cached[0] is not schema:
        if len(_PLAIN) > 100_000:
            _PLAIN.clear()
        plain: tuple[type, ...] = ()
        if isinstance(schema, dict) and isinstance(schema.get("type"), str) \
                and not any(check in schema for check in _SCALAR_CHECKS):
            plain = _PLAIN_TYPES.get(schema["type"], ())
        cached = (schema, plain)
        _PLAIN[id(schema)] = cached
    return cached[1]


def _validate(value: Any, old: Any, schema: dict[str, Any], path: str, walk: _Walk) -> None:
    """Validate ``value`` at ``path``; values equal to the old value are skipped (ratcheting)."""
    if not isinstance(schema, dict):
        return
    if old is not _MISSING and value == old:
        return
    shown = path or "<root>"
    if value is None:
        if not schema.get("nullable"):
            walk.causes.append(field_cause(path, "FieldValueTypeInvalid",
                                           f'Invalid value: "null": {shown} in body must be of type {schema.get("type", "object")}: "null"'))
        return
    if not _type_ok(value, schema):
        expected = "integer or string" if schema.get("x-kubernetes-int-or-string") else schema.get("type")
        walk.causes.append(field_cause(path, "FieldValueTypeInvalid",
                                       f'Invalid value: "{json_type_name(value)}": {shown} in body must be of type {expected}: "{json_type_name(value)}"'))
        return
    if "enum" in schema and value not in schema["enum"]:
        supported = ", ".join(json.dumps(v) for v in schema["enum"])
        walk.causes.append(field_cause(path, "FieldValueNotSupported",
                                       f"Unsupported value: {json.dumps(value)}: supported values: {supported}"))
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and (value < schema["minimum"] or (schema.get("exclusiveMinimum") and value == schema["minimum"])):
            walk.causes.append(field_cause(path, "FieldValueInvalid",
                                           f"Invalid value: {value}: {shown} in body should be greater than or equal to {schema['minimum']}"))
        if "maximum" in schema and (value > schema["maximum"] or (schema.get("exclusiveMaximum") and value == schema["maximum"])):
            walk.causes.append(field_cause(path, "FieldValueInvalid",
                                           f"Invalid value: {value}: {shown} in body should be less than or equal to {schema['maximum']}"))
    if isinstance(value, str):
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            walk.causes.append(field_cause(path, "FieldValueTooLong",
                                           f"Too long: may not be more than {schema['maxLength']} bytes"))
        if "minLength" in schema and len(value) < schema["minLength"]:
            walk.causes.append(field_cause(path, "FieldValueInvalid",
                                           f"Invalid value: {json.dumps(value)}: {shown} in body should be at least {schema['minLength']} chars long"))
        if "pattern" in schema and not re.search(schema["pattern"], value):
            walk.causes.append(field_cause(path, "FieldValueInvalid",
                                           f"Invalid value: {json.dumps(value)}: {shown} in body should match '{schema['pattern']}'"))
    if isinstance(value, dict):
        for required in schema.get("required") or []:
            if required not in value:
                walk.causes.append(field_cause(_path(path, required), "FieldValueRequired", "Required value"))
        props = schema.get("properties") or {}
        additional = schema.get("additionalProperties")
        old_map = old if isinstance(old, dict) else {}
        for key, child in value.items():
            child_schema = props.get(key) if key in props else (additional if isinstance(additional, dict) else None)
            if child_schema is not None and not (path == "" and key in _ROOT_FIELDS) \
                    and type(child) not in _plain(child_schema):
                _validate(child, old_map.get(key, _MISSING), child_schema, _path(path, key), walk)
        if "maxProperties" in schema and len(value) > schema["maxProperties"]:
            walk.causes.append(field_cause(path, "FieldValueTooMany", f"Too many: {len(value)}: must have at most {schema['maxProperties']} items"))
        if "minProperties" in schema and len(value) < schema["minProperties"]:
            walk.causes.append(field_cause(path, "FieldValueInvalid",
                                           f"Invalid value: {len(value)}: {shown} in body should have at least "
                                           f"{schema['minProperties']} properties"))
    if isinstance(value, list):
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            walk.causes.append(field_cause(path, "FieldValueTooMany",
                                           f"Too many: {len(value)}: must have at most {schema['maxItems']} items"))
        if "minItems" in schema and len(value) < schema["minItems"]:
            walk.causes.append(field_cause(path, "FieldValueInvalid",
                                           f"Invalid value: {len(value)}: {shown} in body should have at least {schema['minItems']} items"))
        items = schema.get("items")
        if isinstance(items, dict):
            old_items = old if isinstance(old, list) else []
            old_item = _correlated(schema, old_items)
            plain = _plain(items)
            for i, item in enumerate(value):
                if type(item) not in plain:
                    _validate(item, old_item(i, item), items, f"{path}[{i}]", walk)
        if schema.get("x-kubernetes-list-type") == "map":
            keys = schema.get("x-kubernetes-list-map-keys") or []
            seen = set()
            for i, item in enumerate(value):
                if isinstance(item, dict):
                    ident = tuple(json.dumps(item.get(k)) for k in keys)
                    if ident in seen:
                        walk.causes.append(field_cause(f"{path}[{i}]", "FieldValueDuplicate",
                                                       f"Duplicate value: {json.dumps({k: item.get(k) for k in keys})}"))
                    seen.add(ident)
    for branch in schema.get("allOf") or []:
        _validate(value, old, branch, path, walk)
    _run_rules(value, old, schema, path, walk)


def _root_view(obj: dict[str, Any]) -> dict[str, Any]:
    """What CEL sees at the root: metadata limited to name and generateName, as upstream."""
    view = dict(obj)
    meta = obj.get("metadata") or {}
    view["metadata"] = {k: meta[k] for k in ("name", "generateName") if k in meta}
    return view


def prune(obj: dict[str, Any], schema: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``obj`` without the fields its schema does not know, and their paths."""
    walk = _Walk(check=False)
    return _prune(obj, schema or {}, "", walk, root=True), walk.unknown


def apply_defaults(obj: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """Schema defaults applied to ``obj`` (in place for nested maps; returns the result)."""
    return _default(obj, schema or {})


def validate(obj: dict[str, Any], old: dict[str, Any] | None, schema: dict[str, Any]) -> list[FieldCause]:
    """Every schema and rule violation of ``obj`` (an update of ``old`` when given)."""
    walk = _Walk(check=True)
    _validate(_root_view(obj), _root_view(old) if old is not None else _MISSING, schema or {}, "", walk)
    return walk.causes
