"""JSON patch (RFC 6902) with JSON pointers (RFC 6901), as `application/json-patch+json`.

`apply_json_patch(document, operations)` applies the whole list or nothing: the input is never
modified, and the first failing operation raises `JsonPatchError` whose message names the
operation's position, its `op` and its path (the API server answers it with 422 Invalid).
"""
from __future__ import annotations

import copy
from typing import Any

from trainyard.apimachinery.errors import PatchError

_OPERATIONS = ("add", "remove", "replace", "move", "copy", "test")


class JsonPatchError(PatchError):
    """One operation of a JSON patch failed (or the patch is not a list of operations)."""


def parse_pointer(pointer: str) -> list[str]:
    """`/a/b~1c/~0d` -> `["a", "b/c", "~d"]`; `""` (the whole document) -> `[]`."""
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise ValueError(f"JSON pointer {pointer!r} must start with '/'")
    tokens = []
    for raw in pointer[1:].split("/"):
        if "~" in raw.replace("~0", "").replace("~1", ""):
            raise ValueError(f"JSON pointer {pointer!r} has an invalid '~' escape")
        tokens.append(raw.replace("~1", "/").replace("~0", "~"))
    return tokens


def format_pointer(tokens: list[str]) -> str:
    """The inverse of `parse_pointer`."""
    return "".join("/" + token.replace("~", "~0").replace("/", "~1") for token in tokens)


def apply_json_patch(document: Any, operations: Any) -> Any:
    """Apply RFC 6902 `operations` to a copy of `document` and return it."""
    if not isinstance(operations, list):
        raise JsonPatchError("json patch: the patch must be a JSON array of operations")
    result = copy.deepcopy(document)
    for position, operation in enumerate(operations):
        result = _apply_operation(result, operation, position)
    return result


def _apply_operation(document: Any, operation: Any, position: int) -> Any:
    if not isinstance(operation, dict):
        raise JsonPatchError(f"json patch operation {position}: must be a JSON object")
    name = operation.get("op")
    if name not in _OPERATIONS:
        raise JsonPatchError(f"json patch operation {position}: unknown op {name!r} (expected one of {', '.join(_OPERATIONS)})")
    label = f"json patch operation {position} ({name} {operation.get('path')!r})"
    try:
        path = _pointer_field(operation, "path")
        if name in ("add", "replace", "test") and "value" not in operation:
            raise ValueError("missing 'value'")
        if name == "add":
            return _add(document, path, copy.deepcopy(operation["value"]))
        if name == "remove":
            return _remove(document, path)[0]
        if name == "replace":
            return _replace(document, path, copy.deepcopy(operation["value"]))
        if name == "test":
            if not json_equal(_get(document, path), operation["value"]):
                raise ValueError("test failed: the value differs")
            return document
        source = _pointer_field(operation, "from")
        if name == "move":
            if path[: len(source)] == source and len(path) > len(source):
                raise ValueError("cannot move a value into one of its own children")
            document, moved = _remove(document, source)
            return _add(document, path, moved)
        return _add(document, path, copy.deepcopy(_get(document, source)))
    except (ValueError, KeyError, IndexError, TypeError) as problem:
        raise JsonPatchError(f"{label}: {_reason(problem)}") from None


def _reason(problem: Exception) -> str:
    return str(problem.args[0]) if problem.args else type(problem).__name__


def _pointer_field(operation: dict[str, Any], field: str) -> list[str]:
    value = operation.get(field)
    if not isinstance(value, str):
        raise ValueError(f"missing or non-string {field!r}")
    return parse_pointer(value)


def _get(document: Any, path: list[str]) -> Any:
    current = document
    for depth, token in enumerate(path):
        where = format_pointer(path[: depth + 1])
        if isinstance(current, dict):
            if token not in current:
                raise ValueError(f"path {where} does not exist")
            current = current[token]
        elif isinstance(current, list):
            current = current[_existing_index(token, current, where)]
        else:
            raise ValueError(f"path {where} does not exist (parent is not an object or array)")
    return current


def _add(document: Any, path: list[str], value: Any) -> Any:
    if not path:
        return value
    parent = _get(document, path[:-1])
    token, where = path[-1], format_pointer(path)
    if isinstance(parent, dict):
        parent[token] = value
    elif isinstance(parent, list):
        if token == "-":
            parent.append(value)
        else:
            index = _array_index(token, where)
            if index > len(parent):
                raise ValueError(f"index {index} is out of range for {format_pointer(path[:-1]) or '/'}")
            parent.insert(index, value)
    else:
        raise ValueError(f"path {where} does not exist (parent is not an object or array)")
    return document


def _replace(document: Any, path: list[str], value: Any) -> Any:
    if not path:
        return value
    document, _ = _remove(document, path)
    return _add(document, path, value)


def _remove(document: Any, path: list[str]) -> tuple[Any, Any]:
    if not path:
        raise ValueError("cannot remove the whole document")
    parent = _get(document, path[:-1])
    token, where = path[-1], format_pointer(path)
    if isinstance(parent, dict):
        if token not in parent:
            raise ValueError(f"path {where} does not exist")
        return document, parent.pop(token)
    if isinstance(parent, list):
        return document, parent.pop(_existing_index(token, parent, where))
    raise ValueError(f"path {where} does not exist (parent is not an object or array)")


def _array_index(token: str, where: str) -> int:
    if not token.isdigit() or (len(token) > 1 and token.startswith("0")):
        raise ValueError(f"{where}: {token!r} is not a valid array index")
    return int(token)


def _existing_index(token: str, items: list, where: str) -> int:
    index = _array_index(token, where)
    if index >= len(items):
        raise ValueError(f"path {where} does not exist (index out of range)")
    return index


def json_equal(left: Any, right: Any) -> bool:
    """Equality as JSON sees it: 1 == 1.0, but true != 1."""
    if left is right:
        return True  # the same value (often a subtree shared by copy-on-write)
    if isinstance(left, bool) or isinstance(right, bool):
        return isinstance(left, bool) and isinstance(right, bool) and left == right
    if isinstance(left, dict) and isinstance(right, dict):
        return left.keys() == right.keys() and all(json_equal(left[key], right[key]) for key in left)
    if isinstance(left, list) and isinstance(right, list):
        return len(left) == len(right) and all(json_equal(a, b) for a, b in zip(left, right))
    if isinstance(left, (int, float)) and isinstance(right, (int, float)):
        return left == right
    return type(left) is type(right) and left == right
