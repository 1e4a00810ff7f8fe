"""Custom-resource processing against the CRD's structural schema.

On every write of a custom resource: prune unknown fields (reported per ``fieldValidation``),
apply schema defaults, validate types, required fields, enums, bounds and patterns, and run
``x-kubernetes-validations`` CEL rules (transition rules only on update). Unchanged values are
not re-validated on update (validation ratcheting, as upstream since 1.30).
"""
from __future__ import annotations

import copy
import json
import re
from functools import lru_cache
from typing import Any, Callable

from trainyard.apimachinery.json_types import json_type_name

from . import errors
from .errors import field_cause

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
        self.causes: list[dict[str, str]] = []
        self.check = check


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
                out[key] = _prune(child, props[key], _path(path, key), walk)
            elif isinstance(additional, dict):
                out[key] = _prune(child, additional, _path(path, key), walk)
            elif additional is True or preserve:
                out[key] = child
            else:
                walk.unknown.append(_path(path, key))
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [_prune(item, schema["items"], f"{path}[{i}]", walk) for i, item in enumerate(value)]
    return value


def _default(value: Any, schema: dict[str, Any]) -> Any:
    if not isinstance(schema, dict):
        return value
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        for key, child_schema in props.items():
            if key not in value and isinstance(child_schema, dict) and "default" in child_schema:
                value[key] = copy.deepcopy(child_schema["default"])
            if key in value:
                value[key] = _default(value[key], child_schema)
        additional = schema.get("additionalProperties")
        if isinstance(additional, dict):
            for key in list(value):
                if key not in props:
                    value[key] = _default(value[key], additional)
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


@lru_cache(maxsize=512)
def _compiled_rule(rule: str) -> Callable[[dict[str, Any]], Any] | None:
    try:
        import celpy  # imported lazily: only custom resources with rules need it
    except ImportError:
        return None
    env = celpy.Environment()
    program = env.program(env.compile(rule))
    return program.evaluate


def _to_cel(value: Any) -> Any:
    import celpy
    return celpy.json_to_cel(value)


_SELF_EQ_OLD = re.compile(r"^\s*self\s*==\s*oldSelf\s*$")
_NAME_MATCHES = re.compile(r"^\s*self\.metadata\.name\.matches\('([^']*)'\)\s*$")
_NAME_SIZE = re.compile(r"^\s*size\(self\.metadata\.name\)\s*<=\s*(\d+)\s*$")
_IN_LIST = re.compile(r"^\s*self\s+in\s+\[((?:\s*'[^']*'\s*,?)*)\]\s*$")
_POSITIVE_OR_IN_LIST = re.compile(r"^\s*self\s*>\s*0\s*\|\|\s*self\s+in\s+\[((?:\s*'[^']*'\s*,?)*)\]\s*$")
_HAS_TOKEN = re.compile(r"\s*(has\(self((?:\.[A-Za-z_][A-Za-z0-9_]*)+)\)|&&|\|\||!|\(|\))")


def _strings(listed: str) -> set[str]:
    return set(re.findall(r"'([^']*)'", listed))


def _has(value: Any, path: str) -> bool:
    current = value
    for part in path.strip(".").split("."):
        if not isinstance(current, dict) or part not in current:
            return False
        current = current[part]
    return True


def _has_expression(rule: str) -> Callable[[Any], bool] | None:
    """Compile rules made only of ``has(self.a.b)``, ``!``, ``&&``, ``||`` and parentheses."""
    tokens: list[tuple[str, str]] = []
    pos = 0
    text = rule.strip()
    while pos < len(text):
        m = _HAS_TOKEN.match(text, pos)
        if not m:
            return None
        tokens.append(("has", m.group(2)) if m.group(2) else (m.group(1), ""))
        pos = m.end()
    index = [0]

    def peek() -> str | None:
        return tokens[index[0]][0] if index[0] < len(tokens) else None

    def parse_or() -> Callable[[Any], bool]:
        left = parse_and()
        while peek() == "||":
            index[0] += 1
            right, first = parse_and(), left
            left = (lambda a, b: lambda v: a(v) or b(v))(first, right)
        return left

    def parse_and() -> Callable[[Any], bool]:
        left = parse_not()
        while peek() == "&&":
            index[0] += 1
            right, first = parse_not(), left
            left = (lambda a, b: lambda v: a(v) and b(v))(first, right)
        return left

    def parse_not() -> Callable[[Any], bool]:
        if peek() == "!":
            index[0] += 1
            inner = parse_not()
            return lambda v: not inner(v)
        if peek() == "(":
            index[0] += 1
            inner = parse_or()
            if peek() != ")":
                raise ValueError("unbalanced")
            index[0] += 1
            return inner
        if peek() == "has":
            path = tokens[index[0]][1]
            index[0] += 1
            return lambda v: _has(v, path)
        raise ValueError("unexpected token")
    try:
        compiled = parse_or()
    except (ValueError, IndexError):
        return None
    return compiled if index[0] == len(tokens) else None


@lru_cache(maxsize=512)
def _fast_rule(rule: str) -> Callable[[Any], bool] | None:
    """Native checks for the rule shapes our CRDs use; ``None`` when the rule needs full CEL.

    A fast check that fails falls back to cel-python, so error texts stay CEL's own.
    """
    m = _NAME_MATCHES.match(rule)
    if m:
        pattern = re.compile(m.group(1))
        return lambda v: isinstance(v, dict) and bool(pattern.search(str((v.get("metadata") or {}).get("name", ""))))
    m = _NAME_SIZE.match(rule)
    if m:
        limit = int(m.group(1))
        return lambda v: isinstance(v, dict) and len(str((v.get("metadata") or {}).get("name", ""))) <= limit
    m = _IN_LIST.match(rule)
    if m:
        allowed = _strings(m.group(1))
        return lambda v: isinstance(v, str) and v in allowed
    m = _POSITIVE_OR_IN_LIST.match(rule)
    if m:
        allowed = _strings(m.group(1))
        return lambda v: (isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0) or \
            (isinstance(v, str) and v in allowed)
    return _has_expression(rule)


def _run_rules(value: Any, old: Any, schema: dict[str, Any], path: str, walk: _Walk) -> None:
    for rule_spec in schema.get("x-kubernetes-validations") or []:
        rule = rule_spec.get("rule", "")
        transition = "oldSelf" in rule
        if transition and old is _MISSING:
            continue
        message = rule_spec.get("message") or f"failed rule: {rule}"
        field = path
        if rule_spec.get("fieldPath"):
            field = path + rule_spec["fieldPath"] if rule_spec["fieldPath"].startswith(".") else rule_spec["fieldPath"]
        fast = _fast_rule(rule) if not transition else None
        if _SELF_EQ_OLD.match(rule):
            ok = value == old
        elif fast is not None and fast(value):
            ok = True
        else:
            evaluate = _compiled_rule(rule)
            if evaluate is None:
                continue
            activation = {"self": _to_cel(value)}
            if transition:
                activation["oldSelf"] = _to_cel(old)
            try:
                ok = bool(evaluate(activation))
            except Exception as err:  # noqa: BLE001 - a rule that cannot run is reported, not raised
                walk.causes.append(field_cause(field, "FieldValueInvalid",
                                               f"Invalid value: {_invalid_value(value)}: rule evaluation error: {err}"))
                continue
        if not ok:
            reason = {"FieldValueForbidden": "FieldValueForbidden", "FieldValueRequired": "FieldValueRequired",
                      "FieldValueDuplicate": "FieldValueDuplicate"}.get(rule_spec.get("reason", ""), "FieldValueInvalid")
            walk.causes.append(field_cause(field, reason, f"Invalid value: {_invalid_value(value)}: {message}"))


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
            if child_schema is not None and not (path == "" and key in _ROOT_FIELDS):
                _validate(child, old_map.get(key, _MISSING), child_schema, _path(path, key), walk)
        if "maxProperties" in schema and len(value) > schema["maxProperties"]:
            walk.causes.append(field_cause(path, "FieldValueTooMany", f"Too many: {len(value)}: must have at most {schema['maxProperties']} items"))
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
            for i, item in enumerate(value):
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


class SchemaProcessor:
    """Prune, default and validate custom resources; messages and fields as the real server."""

    def process(self, rt: Any, obj: dict[str, Any], old: dict[str, Any] | None, opts: Any) -> dict[str, Any]:
        schema = rt.schema or {}
        walk = _Walk(check=True)
        pruned = _prune(obj, schema, "", walk, root=True)
        self._report_unknown(walk.unknown, opts)
        pruned = _default(pruned, schema)
        old_view = _root_view(old) if old is not None else _MISSING
        _validate(_root_view(pruned), old_view, schema, "", walk)
        if walk.causes:
            raise errors.invalid(rt.qualified_kind, (obj.get("metadata") or {}).get("name", ""), rt.group, rt.kind,
                                 walk.causes)
        return pruned

    def process_config(self, rt: Any, config: dict[str, Any], opts: Any) -> dict[str, Any]:
        """An apply configuration: pruned and checked for unknown fields, but not defaulted."""
        walk = _Walk(check=False)
        pruned = _prune(config, rt.schema or {}, "", walk, root=True)
        self._report_unknown(walk.unknown, opts)
        return pruned

    @staticmethod
    def _report_unknown(unknown: list[str], opts: Any) -> None:
        if not unknown:
            return
        mode = getattr(opts, "field_validation", "Strict") or "Strict"
        if mode == "Strict":
            if len(unknown) == 1:
                raise errors.bad_request(f'strict decoding error: unknown field "{unknown[0]}"')
            raise errors.bad_request("strict decoding error: " + ", ".join(f'unknown field "{u}"' for u in unknown))
        if mode == "Warn":
            opts.warnings.extend(f'unknown field "{u}"' for u in unknown)
