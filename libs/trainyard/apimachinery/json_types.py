"""The JSON type of a decoded value, named as Kubernetes names it in validation messages."""
from __future__ import annotations

from typing import Any


def json_type_name(value: Any) -> str:
    """``"object"``, ``"array"``, ``"string"``, ``"integer"``, ``"number"``, ``"boolean"`` or ``"null"``.

    CEL violations and schema type errors show this instead of the value itself.
    """
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return "null"
