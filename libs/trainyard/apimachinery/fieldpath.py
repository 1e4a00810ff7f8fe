"""Field paths and field sets as server-side apply records them (`FieldsV1` in managedFields).

A path is a tuple of elements; an element is `(kind, text)`:
- `("f", "spec")` a struct field or map key (`f:spec` in FieldsV1, `.spec` when printed);
- `("k", '{"name":"node"}')` an item of a `listType=map` list, by its key fields as compact JSON
  with sorted keys (`k:{"name":"node"}`, printed `[name="node"]`);
- `("v", '"a"')` an item of a `listType=set` list, by its JSON value (`v:"a"`, printed `[="a"]`);
- `("i", "3")` a list index (`i:3`, printed `[3]`), never produced for our schemas.

A field set is a Python `set` of paths; every path in it is owned ("a member"). FieldsV1 marks a
member that also has owned children with `".": {}`.
"""
from __future__ import annotations

import json
from typing import Any, Iterable, Mapping

from trainyard.apimachinery.errors import MachineryError

PathElement = tuple[str, str]
Path = tuple[PathElement, ...]
FieldSet = set[Path]

_KIND_ORDER = {"f": 0, "k": 1, "v": 2, "i": 3}


def compact_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def field(name: str) -> PathElement:
    return ("f", name)


# Key elements by their key fields: the items of one list have the same few keys (a replicated
# job's or a container's name) on every write, and encoding them was a third of computing a
# field set. Only strings, integers, booleans and null are cached, keyed by (name, type,
# value) so that 1 and True stay apart (a float is encoded each time: 0.0 and -0.0 are equal
# keys with two texts; a map or list value is not hashable). Bounded.
_KEY_ELEMENTS: dict[tuple[tuple[str, type, Any], ...], PathElement] = {}
_KEY_ELEMENTS_SIZE = 4096
_CACHED_TYPES = frozenset((str, int, bool, type(None)))


def key_element(key_fields: Mapping[str, Any]) -> PathElement:
    if not all(type(value) in _CACHED_TYPES for value in key_fields.values()):
        return ("k", compact_json(dict(key_fields)))
    cache_key = tuple((name, type(value), value) for name, value in key_fields.items())
    element = _KEY_ELEMENTS.get(cache_key)
    if element is None:
        element = ("k", compact_json(dict(key_fields)))
        if len(_KEY_ELEMENTS) >= _KEY_ELEMENTS_SIZE:
            _KEY_ELEMENTS.clear()
        _KEY_ELEMENTS[cache_key] = element
    return element


def value_element(value: Any) -> PathElement:
    return ("v", compact_json(value))


def element_sort_key(element: PathElement) -> tuple[int, str]:
    return (_KIND_ORDER.get(element[0], 9), element[1])


def path_sort_key(path: Path) -> tuple[tuple[int, str], ...]:
    return tuple(element_sort_key(element) for element in path)


def format_path(path: Path) -> str:
    """`.spec.containers[name="node"].image`, as the API server prints conflict paths."""
    parts = []
    for kind, text in path:
        if kind == "f":
            parts.append(f".{text}")
        elif kind == "k":
            fields = json.loads(text)
            parts.append("[" + ",".join(f"{name}={compact_json(value)}" for name, value in sorted(fields.items())) + "]")
        elif kind == "v":
            parts.append(f"[={text}]")
        else:
            parts.append(f"[{text}]")
    return "".join(parts)


def to_fields_v1(fields: Iterable[Path]) -> dict[str, Any]:
    """Encode a field set as a FieldsV1 tree (`{"f:spec": {"f:replicas": {}}}`): every level in
    element order (fields, keys, values, indexes; then by text), a member with owned children
    marked with `".": {}` first."""
    members = set(fields)
    tree: dict[PathElement, dict] = {}
    for path in members:
        node = tree
        for element in path:
            child = node.get(element)
            if child is None:
                child = node[element] = {}
            node = child
    return _encoded(tree, (), members, False)


def _encoded(node: dict[PathElement, dict], prefix: Path, members: set[Path], marked: bool) -> dict[str, Any]:
    ordered: list[tuple[tuple[int, str], str, Any, Any]] = [
        (element_sort_key(element), f"{element[0]}:{element[1]}", element, child) for element, child in node.items()]
    if marked:
        ordered.append(((0, ""), ".", None, None))  # after an empty field name (a stable sort), as before
    ordered.sort(key=lambda item: item[0])
    out: dict[str, Any] = {}
    for _, key, element, child in ordered:
        if element is None:
            out["."] = {}
        elif child:
            path = prefix + (element,)
            out[key] = _encoded(child, path, members, path in members)
        else:
            out[key] = {}
    return out


def from_fields_v1(tree: Mapping[str, Any]) -> FieldSet:
    """Decode a FieldsV1 tree into a field set; `MachineryError` for a malformed tree."""
    if not isinstance(tree, Mapping):
        raise MachineryError("managedFields[].fieldsV1 must be an object")
    members: FieldSet = set()
    _collect(tree, (), members)
    return members


def _collect(node: Mapping[str, Any], prefix: Path, members: FieldSet) -> None:
    for key, child in node.items():
        if key == ".":
            if prefix:
                members.add(prefix)
            continue
        if not isinstance(child, Mapping):
            raise MachineryError(f"managedFields[].fieldsV1: {key!r} must map to an object")
        path = prefix + (_parse_element(key),)
        if not child:
            members.add(path)
        else:
            _collect(child, path, members)


def _parse_element(key: str) -> PathElement:
    kind, separator, text = key.partition(":")
    if not separator or kind not in _KIND_ORDER:
        raise MachineryError(f"managedFields[].fieldsV1: {key!r} is not a field path element")
    return (kind, text)


