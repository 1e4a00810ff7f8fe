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
