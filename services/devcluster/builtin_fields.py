"""Unknown-field handling for built-in kinds, from the Kubernetes 1.36 definitions.

The real server decodes built-in objects into typed structs: unknown fields are dropped, and
reported per ``fieldValidation`` (``Strict`` → 400, ``Warn`` → warning). Same here.
"""
from __future__ import annotations

from typing import Any

_REF_PREFIX = "#/$defs/"


def _resolve(schema: dict[str, Any], definitions: Any) -> dict[str, Any]:
    while "$ref" in schema:
        ref = schema["$ref"]
        name = ref[len(_REF_PREFIX):] if ref.startswith(_REF_PREFIX) else ref.rsplit("/", 1)[-1]
        schema = definitions.get(name, {})
    return schema


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def prune_unknown(value: Any, schema: dict[str, Any], definitions: Any, path: str, unknown: list[str]) -> Any:
    """``value`` without fields its definition does not declare; their paths go to ``unknown``."""
    schema = _resolve(schema, definitions)
    if isinstance(value, dict):
        props = schema.get("properties")
        additional = schema.get("additionalProperties")
        if props is None:
            if isinstance(additional, dict):
                return {k: prune_unknown(v, additional, definitions, _join(path, k), unknown) for k, v in value.items()}
            return value  # free-form (RawExtension, JSON, quantities)
        out = {}
        for key, child in value.items():
            if key in props:
                out[key] = prune_unknown(child, props[key], definitions, _join(path, key), unknown)
            else:
                unknown.append(_join(path, key))
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [prune_unknown(item, schema["items"], definitions, f"{path}[{i}]", unknown) for i, item in enumerate(value)]
    return value


# ---------------------------------------------------------------- validation of stored-only kinds

_JSON_TYPES = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "null": lambda v: v is None,
}


def _types(schema: dict[str, Any]) -> list[str]:
    declared = schema.get("type")
    if declared is None:
        return []
    return [declared] if isinstance(declared, str) else list(declared)


def _matches(value: Any, schema: dict[str, Any], definitions: Any) -> bool:
    schema = _resolve(schema, definitions)
    if "oneOf" in schema:
        return any(_matches(value, branch, definitions) for branch in schema["oneOf"])
    types = _types(schema)
    return not types or any(_JSON_TYPES.get(t, lambda v: True)(value) for t in types)


def _shown(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return type(value).__name__
    return f'"{value}"' if isinstance(value, str) else str(value).lower() if isinstance(value, bool) else str(value)


def validate_definition(value: Any, schema: dict[str, Any], definitions: Any, path: str,
                        causes: list[dict[str, str]]) -> None:
    """Type, required-field and enum errors of ``value`` against a Kubernetes definition, as
    ``{"reason", "message", "field"}`` causes (what the real server's validation reports)."""
    schema = _resolve(schema, definitions)
    if not _matches(value, schema, definitions):
        expected = " or ".join(t for t in (_types(schema) or ["string or number"]) if t != "null")
        causes.append({"reason": "FieldValueInvalid", "field": path,
                       "message": f"Invalid value: {_shown(value)}: must be of type {expected}"})
        return
    if value is None:
        return
    enum = schema.get("enum")
    if enum and value not in enum:
        supported = ", ".join(f'"{e}"' for e in enum if e is not None)
        causes.append({"reason": "FieldValueNotSupported", "field": path,
                       "message": f"Unsupported value: {_shown(value)}: supported values: {supported}"})
    if isinstance(value, dict):
        props = schema.get("properties")
        for name in schema.get("required") or ():
            if value.get(name) in (None, "", [], {}) and not (name in value and value[name] in ([], {})):
                causes.append({"reason": "FieldValueRequired", "field": _join(path, name), "message": "Required value"})
        if props is not None:
            for key, child in value.items():
                if key in props:
                    validate_definition(child, props[key], definitions, _join(path, key), causes)
        elif isinstance(schema.get("additionalProperties"), dict):
            for key, child in value.items():
                validate_definition(child, schema["additionalProperties"], definitions, _join(path, key), causes)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            validate_definition(item, schema["items"], definitions, f"{path}[{i}]", causes)


_WORKLOAD_KINDS = {"Deployment", "StatefulSet", "ReplicaSet", "DaemonSet"}


def _selector_matches(selector: dict[str, Any], labels: dict[str, Any]) -> bool:
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression.get("key"), expression.get("operator"), expression.get("values") or []
        if operator == "In" and labels.get(key) not in values:
            return False
        if operator == "NotIn" and key in labels and labels[key] in values:
            return False
        if operator == "Exists" and key not in labels:
            return False
        if operator == "DoesNotExist" and key in labels:
            return False
    return True


def semantic_causes(kind: str, obj: dict[str, Any]) -> list[dict[str, str]]:
    """The cross-field checks of the real server that clients rely on for the stored-only kinds."""
    causes: list[dict[str, str]] = []
    spec = obj.get("spec") or {}
    if kind in _WORKLOAD_KINDS:
        selector = spec.get("selector") or {}
        labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
        if selector and not (selector.get("matchLabels") or selector.get("matchExpressions")):
            causes.append({"reason": "FieldValueInvalid", "field": "spec.selector",
                           "message": "Invalid value: \"null\": empty selector is invalid for deployment"})
        elif selector and not _selector_matches(selector, labels):
            causes.append({"reason": "FieldValueInvalid", "field": "spec.template.metadata.labels",
                           "message": f"Invalid value: {labels}: `selector` does not match template `labels`"})
    if kind == "PodDisruptionBudget" and "minAvailable" in spec and "maxUnavailable" in spec:
        causes.append({"reason": "FieldValueInvalid", "field": "spec",
                       "message": "Invalid value: minAvailable and maxUnavailable cannot be both set"})
    if kind == "HorizontalPodAutoscaler":
        causes += _hpa_causes(spec)
    if kind in {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}:
        from trainyard.apimachinery.admission_policy import spec_causes
        causes += spec_causes(kind, obj)
    if kind in {"RoleBinding", "ClusterRoleBinding"}:
        ref = obj.get("roleRef") or {}
        allowed = {"ClusterRole"} if kind == "ClusterRoleBinding" else {"Role", "ClusterRole"}
        if ref.get("kind") and ref["kind"] not in allowed:
            causes.append({"reason": "FieldValueNotSupported", "field": "roleRef.kind",
                           "message": f'Unsupported value: "{ref["kind"]}": supported values: '
                                      + ", ".join(f'"{k}"' for k in sorted(allowed))})
    return causes


def _hpa_causes(spec: dict[str, Any]) -> list[dict[str, str]]:
    """autoscaling/v2 HorizontalPodAutoscaler bounds, as kube-apiserver's validation words them."""
    causes: list[dict[str, str]] = []
    low, high = spec.get("minReplicas"), spec.get("maxReplicas")
    if isinstance(low, int) and low < 1:
        causes.append({"reason": "FieldValueInvalid", "field": "spec.minReplicas",
                       "message": f"Invalid value: {low}: must be greater than or equal to 1"})
    if isinstance(high, int) and high < 1:
        causes.append({"reason": "FieldValueInvalid", "field": "spec.maxReplicas",
                       "message": f"Invalid value: {high}: must be greater than 0"})
    if isinstance(low, int) and isinstance(high, int) and high < low:
        causes.append({"reason": "FieldValueInvalid", "field": "spec.maxReplicas",
                       "message": f"Invalid value: {high}: must be greater than or equal to `minReplicas`"})
    return causes


def update_causes(key: tuple[str, str], obj: dict[str, Any], old: dict[str, Any]) -> list[dict[str, str]]:
    """Update rules of built-in kinds the server enforces (beyond the create-time checks)."""
    if key == ("batch", "jobs"):
        return job_update_causes(obj, old)
    return []


def job_update_causes(job: dict[str, Any], old: dict[str, Any]) -> list[dict[str, str]]:
    """batch/v1 Job ``spec.completions`` on update (Kubernetes >= 1.27, elastic Indexed Jobs):
    immutable unless the Job is Indexed, where it may change only together with an equal
    ``spec.parallelism``."""
    spec, old_spec = job.get("spec") or {}, old.get("spec") or {}
    completions = spec.get("completions")
    if completions == old_spec.get("completions"):
        return []
    if spec.get("completionMode") != "Indexed":
        return [{"reason": "FieldValueInvalid", "field": "spec.completions",
                 "message": f"Invalid value: {_shown(completions) if completions is not None else 'null'}: "
                            "field is immutable"}]
    if completions is None:
        return []  # Indexed without completions is refused elsewhere (Required value)
    parallelism = spec.get("parallelism")
    if completions != (1 if parallelism is None else parallelism):
        return [{"reason": "FieldValueInvalid", "field": "spec.completions",
                 "message": f"Invalid value: {_shown(completions)}: can only be modified in tandem with spec.parallelism"}]
    return []
