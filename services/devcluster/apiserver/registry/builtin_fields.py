"""Unknown-field handling for built-in kinds, from the Kubernetes 1.36 definitions.

The real server decodes built-in objects into typed structs: unknown fields are dropped, and
reported per ``fieldValidation`` (``Strict`` → 400, ``Warn`` → warning). Same here.
"""
from __future__ import annotations

from typing import Any

from trainyard.apimachinery.quantity import QuantityError, parse_quantity

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


# The cross-field checks of the real server that clients rely on for the stored-only kinds;
# each kind's strategy (apiserver/registry/strategies.py) names the ones it has.

def workload_selector_causes(obj: dict[str, Any]) -> list[dict[str, str]]:
    """Deployments, StatefulSets, ReplicaSets, DaemonSets: the selector matches the template."""
    spec = obj.get("spec") or {}
    selector = spec.get("selector") or {}
    labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
    if selector and not (selector.get("matchLabels") or selector.get("matchExpressions")):
        return [{"reason": "FieldValueInvalid", "field": "spec.selector",
                 "message": "Invalid value: \"null\": empty selector is invalid for deployment"}]
    if selector and not _selector_matches(selector, labels):
        return [{"reason": "FieldValueInvalid", "field": "spec.template.metadata.labels",
                 "message": f"Invalid value: {labels}: `selector` does not match template `labels`"}]
    return []


def pdb_causes(obj: dict[str, Any]) -> list[dict[str, str]]:
    """PodDisruptionBudget: one of minAvailable and maxUnavailable."""
    spec = obj.get("spec") or {}
    if "minAvailable" in spec and "maxUnavailable" in spec:
        return [{"reason": "FieldValueInvalid", "field": "spec",
                 "message": "Invalid value: minAvailable and maxUnavailable cannot be both set"}]
    return []


def role_ref_kind_causes(obj: dict[str, Any], allowed: frozenset[str]) -> list[dict[str, str]]:
    """A binding's roleRef kind: Role or ClusterRole (a ClusterRoleBinding: ClusterRole)."""
    ref = obj.get("roleRef") or {}
    if ref.get("kind") and ref["kind"] not in allowed:
        return [{"reason": "FieldValueNotSupported", "field": "roleRef.kind",
                 "message": f'Unsupported value: "{ref["kind"]}": supported values: '
                            + ", ".join(f'"{k}"' for k in sorted(allowed))}]
    return []


def hpa_causes(obj: dict[str, Any]) -> list[dict[str, str]]:
    """autoscaling/v2 HorizontalPodAutoscaler bounds, as kube-apiserver's validation words them."""
    spec = obj.get("spec") or {}
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
    for number, metric in enumerate(spec.get("metrics") or []):
        if isinstance(metric, dict):
            causes += _metric_causes(metric, f"spec.metrics[{number}]")
    return causes


_METRIC_SOURCES = {"Object": "object", "Pods": "pods", "Resource": "resource", "External": "external",
                   "ContainerResource": "containerResource"}


def _cause(reason: str, path: str, message: str) -> dict[str, str]:
    return {"reason": reason, "field": path, "message": message}


def _positive_quantity(value: Any) -> bool:
    try:
        return parse_quantity(value).value > 0
    except QuantityError:
        return True  # not a quantity: the definition check reports it


def _metric_causes(metric: dict[str, Any], path: str) -> list[dict[str, str]]:
    """One autoscaling/v2 MetricSpec, as kube-apiserver's validateMetricSpec words it."""
    causes: list[dict[str, str]] = []
    kind = metric.get("type") or ""
    expected = _METRIC_SOURCES.get(kind)
    if expected is None:
        causes.append(_cause("FieldValueNotSupported", f"{path}.type", f'Unsupported value: "{kind}": supported '
                             'values: "ContainerResource", "External", "Object", "Pods", "Resource"'))
    # kube-apiserver looks at the sources in this order and validates only the first present
    present = [field for field in ("object", "external", "pods", "resource", "containerResource")
               if isinstance(metric.get(field), dict)]
    if present:
        source, first = metric[present[0]], f"{path}.{present[0]}"
        target = source.get("target") or {}
        causes += _target_causes(target, f"{first}.target")
        if present[0] in ("object", "pods", "external"):
            name = (source.get("metric") or {}).get("name")
            if not name:
                causes.append(_cause("FieldValueRequired", f"{first}.metric.name",
                                     "Required value: must specify a metric name"))
        if present[0] in ("resource", "containerResource"):
            if not source.get("name"):
                causes.append(_cause("FieldValueRequired", f"{first}.name", "Required value: must specify a resource name"))
            if present[0] == "containerResource" and not source.get("container"):
                causes.append(_cause("FieldValueRequired", f"{first}.container",
                                     "Required value: must specify a container"))
            if target.get("averageUtilization") is None and target.get("averageValue") is None:
                causes.append(_cause("FieldValueRequired", f"{first}.target.averageUtilization",
                                     "Required value: must set either a target raw value or a target utilization"))
            if target.get("averageUtilization") is not None and target.get("averageValue") is not None:
                causes.append(_cause("FieldValueForbidden", f"{first}.target.averageValue",
                                     "Forbidden: may not set both a target raw value and a target utilization"))
        elif present[0] == "pods" and target.get("averageValue") is None:
            causes.append(_cause("FieldValueRequired", f"{first}.target.averageValue",
                                 "Required value: must specify a positive target averageValue"))
        elif present[0] == "object" and target.get("value") is None and target.get("averageValue") is None:
            causes.append(_cause("FieldValueRequired", f"{first}.target.averageValue",
                                 "Required value: must set either a target value or averageValue"))
        elif present[0] == "external":
            if target.get("value") is None and target.get("averageValue") is None:
                causes.append(_cause("FieldValueRequired", f"{first}.target.averageValue",
                                     "Required value: must set either a target value for metric or a per-pod target"))
            if target.get("value") is not None and target.get("averageValue") is not None:
                causes.append(_cause("FieldValueForbidden", f"{first}.target.value",
                                     "Forbidden: may not set both a target value for metric and a per-pod target"))
    if expected is not None and expected not in present:
        causes.append(_cause("FieldValueRequired", f"{path}.{expected}",
                             "Required value: must populate information for the given metric source"))
    if len(present) != 1:
        for other in present:
            if other != expected:
                causes.append(_cause("FieldValueForbidden", f"{path}.{other}",
                                     "Forbidden: must populate the given metric source only"))
    return causes


def _target_causes(target: dict[str, Any], path: str) -> list[dict[str, str]]:
    causes: list[dict[str, str]] = []
    kind = target.get("type")
    if kind not in ("Utilization", "Value", "AverageValue"):
        causes.append(_cause("FieldValueInvalid", f"{path}.type",
                             f'Invalid value: "{kind or ""}": must be either Utilization, Value, or AverageValue'))
    for key in ("value", "averageValue"):
        if target.get(key) is not None and not _positive_quantity(target[key]):
            causes.append(_cause("FieldValueInvalid", f"{path}.{key}", f'Invalid value: "{target[key]}": must be positive'))
    utilization = target.get("averageUtilization")
    if isinstance(utilization, int) and utilization < 1:
        causes.append(_cause("FieldValueInvalid", f"{path}.averageUtilization",
                             f"Invalid value: {utilization}: must be greater than 0"))
    return causes


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
