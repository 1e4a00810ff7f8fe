"""Strict parsing: find fields a document has that its schema does not know.

Models keep unknown fields (lossless round trip); strict mode reports them instead, the way
``kubectl --validate=strict`` does. Trainer, JobSet and PodGroup models are complete, so any
extra key there is unknown; for built-in Kubernetes types, the pinned OpenAPI definitions
decide.
"""
from __future__ import annotations

from typing import Any

from trainyard.api.meta import KubeModel
from trainyard.apimachinery.openapi_definitions import definition, ref_name

_ENVELOPE = {"apiVersion", "kind", "metadata"}


def unknown_fields(obj: KubeModel, path: str = "") -> list[str]:
    """JSON paths of the fields of ``obj`` that its schema does not define."""
    found: list[str] = []
    _walk_model(obj, path, found)
    return found


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _walk_model(obj: KubeModel, path: str, found: list[str]) -> None:
    extras = obj.__pydantic_extra__ or {}
    k8s_name = type(obj).k8s_definition
    properties = definition(k8s_name).get("properties", {}) if k8s_name else None
    for key, value in extras.items():
        if properties is not None and key in properties:
            _walk_schema(value, properties[key], _join(path, key), found)
        elif not (path == "" and key in _ENVELOPE):
            found.append(_join(path, key))
    for name, info in type(obj).model_fields.items():
        if name in obj.model_fields_set:
            key = info.alias or name
            field_schema = properties.get(key) if properties is not None else None
            _walk_value(getattr(obj, name), _join(path, key), found, field_schema)


def _walk_value(value: Any, path: str, found: list[str], field_schema: dict[str, Any] | None) -> None:
    """A typed field's value: models check themselves, untyped data is checked by schema."""
    if isinstance(value, KubeModel):
        _walk_model(value, path, found)
    elif isinstance(value, list):
        items = field_schema.get("items") if field_schema else None
        for index, item in enumerate(value):
            _walk_value(item, f"{path}[{index}]", found, items)
    elif isinstance(value, dict) and field_schema is not None:
        _walk_schema(value, field_schema, path, found)


def _walk_schema(value: Any, schema: dict[str, Any], path: str, found: list[str]) -> None:
    """Check untyped data against a Kubernetes definition schema."""
    while "$ref" in schema:
        schema = definition(ref_name(schema["$ref"]))
    if isinstance(value, dict):
        properties = schema.get("properties")
        additional = schema.get("additionalProperties")
        for key, item in value.items():
            if properties is not None and key in properties:
                _walk_schema(item, properties[key], _join(path, key), found)
            elif isinstance(additional, dict):
                _walk_schema(item, additional, _join(path, key), found)
            elif properties is not None:
                found.append(_join(path, key))
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            _walk_schema(item, schema["items"], f"{path}[{index}]", found)
