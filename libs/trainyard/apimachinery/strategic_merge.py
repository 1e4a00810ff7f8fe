"""Kubernetes strategic merge patch, driven by the pinned 1.36 OpenAPI definitions.

Semantics (those of the API server's `application/strategic-merge-patch+json`):
- maps merge key by key; `null` deletes a key; a field with patch strategy `replace` is replaced;
- lists with patch strategy `merge` merge: lists of objects item by item on the merge key
  (containers by `name`, volumeMounts by `mountPath`, ports by `containerPort`, ...), lists of
  scalars as a set union; all other lists are replaced whole (e.g. `tolerations`, `args`);
- directives: `$patch: replace|delete` in a map (and `merge`, accepted as the default), list items
  `{"$patch": "delete", <key>: v}` and `{"$patch": "replace"}`, `$retainKeys: [...]`,
  `$deleteFromPrimitiveList/<field>: [...]`, `$setElementOrder/<field>: [...]`;
- result order of a merged list: the live order, with items named by the patch in patch order
  (or `$setElementOrder` order) interleaved as upstream does; new items go after the live items
  they follow in the patch.

Directives never leak into the result, and `null`s inside brand-new values are dropped.
Strategic merge does not exist for custom resources: `strategic_merge_patch` raises
`UnsupportedPatchType` for names the definitions do not know, unless the caller asks for the
JSON merge patch fallback.
"""
from __future__ import annotations

import copy
from typing import Any

from trainyard.apimachinery.errors import PatchError, UnsupportedPatchType
from trainyard.apimachinery.merge_patch import json_merge_patch
from trainyard.apimachinery.openapi_definitions import (
    UNTYPED,
    SchemaNode,
    builtin_schema,
    has_definition,
)

DIRECTIVE = "$patch"
RETAIN_KEYS = "$retainKeys"
DELETE_FROM_PRIMITIVE_LIST = "$deleteFromPrimitiveList/"
SET_ELEMENT_ORDER = "$setElementOrder/"

Json = Any


def strategic_merge_patch(
    original: dict[str, Any],
    patch: dict[str, Any],
    type_name: str,
    *,
    fall_back_to_merge_patch: bool = False,
) -> dict[str, Any]:
    """Apply strategic merge `patch` to `original` (neither is modified); returns the result.

    `type_name` is a built-in definition name such as `io.k8s.api.core.v1.PodTemplateSpec`.
    For an unknown name: `UnsupportedPatchType`, or a JSON merge patch (RFC 7386) when
    `fall_back_to_merge_patch` is set. Malformed patches raise `PatchError`.
    """
    if not has_definition(type_name):
        if fall_back_to_merge_patch:
            return json_merge_patch(original, patch)
        raise UnsupportedPatchType(f"strategic merge patch is not supported for type {type_name!r}")
    return strategic_merge_patch_with_schema(original, patch, builtin_schema(type_name))


def strategic_merge_patch_with_schema(
    original: dict[str, Any], patch: dict[str, Any], schema: SchemaNode
) -> dict[str, Any]:
    """Strategic merge with an explicit schema walker (see `openapi_definitions.SchemaNode`)."""
    if not isinstance(original, dict):
        raise PatchError("strategic merge patch: the original document must be a JSON object")
    if not isinstance(patch, dict):
        raise PatchError("strategic merge patch: the patch must be a JSON object")
    return _merge_map(copy.deepcopy(original), copy.deepcopy(patch), schema, "")


# -- maps ------------------------------------------------------------------------------------


def _merge_map(original: dict[str, Any], patch: dict[str, Any], schema: SchemaNode, path: str) -> dict:
    if DIRECTIVE in patch:
        directive = patch.pop(DIRECTIVE)
        if directive == "replace":
            return _fresh_value(patch, schema, path)
        if directive == "delete":
            return {}
        if directive != "merge":
            raise PatchError(f"{_where(path)}: unknown patch directive $patch: {directive!r} in a map")
    _apply_retain_keys(original, patch, path)
    _merge_ordered_lists(original, patch, schema, path)
    for key, patch_value in patch.items():
        if key.startswith(DELETE_FROM_PRIMITIVE_LIST):
            _delete_from_primitive_list(original, key, patch_value, path)
            continue
        child = schema.field(key) or UNTYPED
        child_path = f"{path}.{key}"
        if patch_value is None:
            original.pop(key, None)
            continue
        if key not in original or _json_kind(original[key]) != _json_kind(patch_value):
            original[key] = _fresh_value(patch_value, child, child_path)
        elif isinstance(patch_value, dict):
            if "replace" in child.patch_strategies:
                original[key] = _fresh_value(patch_value, child, child_path)
            else:
                original[key] = _merge_map(original[key], patch_value, child, child_path)
        elif isinstance(patch_value, list):
            original[key] = _merge_list_field(original[key], patch_value, child, child_path)
        else:
            original[key] = patch_value
    return original


def _apply_retain_keys(original: dict[str, Any], patch: dict[str, Any], path: str) -> None:
    """`$retainKeys`: keep only the listed keys of the original (e.g. switching a volume's source)."""
    if RETAIN_KEYS not in patch:
        return
    retain = patch.pop(RETAIN_KEYS)
    if not isinstance(retain, list) or not all(isinstance(key, str) for key in retain):
        raise PatchError(f"{_where(path)}: $retainKeys must be a list of field names")
    for key, value in patch.items():
        if value is None or key.startswith((DELETE_FROM_PRIMITIVE_LIST, SET_ELEMENT_ORDER)):
            continue
        if key not in retain:
            raise PatchError(f"{_where(path)}: field {key!r} is in the patch but not in $retainKeys")
    for key in [key for key in original if key not in retain]:
        del original[key]


def _delete_from_primitive_list(original: dict[str, Any], key: str, values: Json, path: str) -> None:
    field = key[len(DELETE_FROM_PRIMITIVE_LIST):]
    if not isinstance(values, list):
        raise PatchError(f"{_where(path)}: {key} must be a list of values")
    current = original.get(field)
    if not isinstance(current, list):
        return
    if any(isinstance(item, (dict, list)) for item in values + current):
        raise PatchError(f"{_where(path + '.' + field)}: $deleteFromPrimitiveList needs a list of scalars")
    original[field] = [item for item in current if not any(_same_scalar(item, gone) for gone in values)]


# -- lists -----------------------------------------------------------------------------------


def _merge_list_field(original: list, patch: list, schema: SchemaNode, path: str) -> list:
    if "merge" not in schema.patch_strategies:
        return _fresh_value(patch, schema, path)
    return _merge_list(original, patch, schema, path)


def _merge_list(original: list, patch: list, schema: SchemaNode, path: str) -> list:
    if not original and not patch:
        return original
    items_are_maps = _list_element_kind(original + patch, path) == "object"
    item_schema = schema.items() or UNTYPED
    if not items_are_maps:
        merged = _unique_scalars(original + patch)
        return _enforce_order(merged, patch, original, "", path)
    merge_key = schema.patch_merge_key
    if not merge_key:
        raise PatchError(f"{_where(path)}: cannot merge a list of objects without a merge key")
    original, patch = _apply_list_directives(original, patch, merge_key, path)
    merged = list(original)
    for item in patch:
        key_value = _merge_key_value(item, merge_key, path)
        position = _find_by_key(merged, merge_key, key_value)
        item_path = f"{path}[{merge_key}={key_value!r}]"
        if position is None:
            merged.append(_fresh_value(item, item_schema, item_path))
        else:
            merged[position] = _merge_map(merged[position], item, item_schema, item_path)
    return _enforce_order(merged, patch, original, merge_key, path)


def _apply_list_directives(original: list, patch: list, merge_key: str, path: str) -> tuple[list, list]:
    """Handle `{"$patch": "delete", key: v}` and `{"$patch": "replace"}` items of a patch list."""
    plain_items: list = []
    replace = False
    for item in patch:
        directive = item.get(DIRECTIVE)
        if directive is None:
            plain_items.append(item)
        elif directive == "delete":
            key_value = _merge_key_value(item, merge_key, path)
            original = [kept for kept in original if not _key_matches(kept, merge_key, key_value)]
        elif directive == "replace":
            replace = True
        elif directive == "merge":
            raise PatchError(f"{_where(path)}: $patch: merge is not supported inside a list")
        else:
            raise PatchError(f"{_where(path)}: unknown patch directive $patch: {directive!r} in a list")
    if replace:
        return [_strip_nulls_and_directives(item) for item in plain_items], []
    return original, plain_items


def _merge_ordered_lists(original: dict[str, Any], patch: dict[str, Any], schema: SchemaNode, path: str) -> None:
    """`$setElementOrder/<field>`: merge that list now and put its items in the given order."""
    for directive_key in [key for key in patch if key.startswith(SET_ELEMENT_ORDER)]:
        order = patch.pop(directive_key)
        field = directive_key[len(SET_ELEMENT_ORDER):]
        field_path = f"{path}.{field}"
        if not isinstance(order, list):
            raise PatchError(f"{_where(field_path)}: {directive_key} must be a list")
        child = schema.field(field) or UNTYPED
        merge_key = child.patch_merge_key
        live = original.get(field)
        patch_list = patch.pop(field, None)
        if (live is not None and not isinstance(live, list)) or (patch_list is not None and not isinstance(patch_list, list)):
            raise PatchError(f"{_where(field_path)}: {directive_key} applies to a list field")
        _check_order_covers_patch(patch_list or [], order, merge_key, field_path)
        if live is None and patch_list is None:
            continue
        if patch_list is None:
            merged = live
        elif live is None:
            merged = _fresh_value(patch_list, child, field_path)
        else:
            merged = _merge_list_field(live, patch_list, child, field_path)
        original[field] = _enforce_order(merged, order, live or [], merge_key, field_path)


def _check_order_covers_patch(patch_list: list, order: list, merge_key: str, path: str) -> None:
    """Every (non-directive) patch item must appear in the order list, in the same relative order."""
    wanted = [item for item in patch_list if not (isinstance(item, dict) and DIRECTIVE in item)]
    position = 0
    for item in wanted:
        while position < len(order) and not _same_item(item, order[position], merge_key):
            position += 1
        if position == len(order):
            raise PatchError(f"{_where(path)}: the order of the patch list does not match $setElementOrder")
        position += 1


def _enforce_order(merged: list, patch_order: list, live_order: list, merge_key: str, path: str) -> list:
    """Upstream's ordering: patch items in patch order, live-only items in live order, interleaved
    by their live positions wherever both are known."""
    from_patch = [item for item in merged if _index_in(patch_order, item, merge_key) >= 0]
    live_only = [item for item in merged if _index_in(patch_order, item, merge_key) < 0]
    from_patch.sort(key=lambda item: _index_in(patch_order, item, merge_key))
    if any(_index_in(live_order, item, merge_key) < 0 for item in live_only):
        raise PatchError(f"{_where(path)}: list items are missing from $setElementOrder")
    live_only.sort(key=lambda item: _index_in(live_order, item, merge_key))
    result: list = []
    left, right = 0, 0
    while left < len(live_only) or right < len(from_patch):
        if left >= len(live_only):
            result.append(from_patch[right])
            right += 1
        elif right >= len(from_patch):
            result.append(live_only[left])
            left += 1
        else:
            live_position = _index_in(live_order, live_only[left], merge_key)
            patch_item_position = _index_in(live_order, from_patch[right], merge_key)
            if patch_item_position >= 0 and live_position < patch_item_position:
                result.append(live_only[left])
                left += 1
            else:
                result.append(from_patch[right])
                right += 1
    return result


# -- values ----------------------------------------------------------------------------------


def _fresh_value(value: Json, schema: SchemaNode, path: str) -> Json:
    """A patch value that lands where nothing was: directives are applied, nulls dropped."""
    if isinstance(value, dict):
        return _merge_map({}, value, schema, path)
    if isinstance(value, list):
        if "merge" in schema.patch_strategies and value and isinstance(value[0], dict):
            return _merge_list([], value, schema, path)
        item_schema = schema.items() or UNTYPED
        return [_fresh_value(item, item_schema, f"{path}[{index}]") for index, item in enumerate(value)]
    return value


def _strip_nulls_and_directives(value: Json) -> Json:
    if isinstance(value, dict):
        return {
            key: _strip_nulls_and_directives(item)
            for key, item in value.items()
            if item is not None and not key.startswith("$")
        }
    if isinstance(value, list):
        return [_strip_nulls_and_directives(item) for item in value]
    return value


def _json_kind(value: Json) -> str:
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    return "null"


def _list_element_kind(items: list, path: str) -> str:
    kinds = {_json_kind(item) for item in items}
    if "array" in kinds:
        raise PatchError(f"{_where(path)}: lists of lists cannot be merged")
    if len(kinds) > 1:
        raise PatchError(f"{_where(path)}: list element types are not identical")
    return kinds.pop()


def _same_scalar(left: Json, right: Json) -> bool:
    return _json_kind(left) == _json_kind(right) and left == right


def _unique_scalars(items: list) -> list:
    unique: list = []
    for item in items:
        if not any(_same_scalar(item, seen) for seen in unique):
            unique.append(item)
    return unique


def _merge_key_value(item: Json, merge_key: str, path: str) -> Json:
    if not isinstance(item, dict) or merge_key not in item:
        raise PatchError(f"{_where(path)}: every list item must have the merge key {merge_key!r}")
    return item[merge_key]


def _key_matches(item: Json, merge_key: str, key_value: Json) -> bool:
    return isinstance(item, dict) and merge_key in item and _same_scalar(item[merge_key], key_value)


def _find_by_key(items: list, merge_key: str, key_value: Json) -> int | None:
    for position, item in enumerate(items):
        if _key_matches(item, merge_key, key_value):
            return position
    return None


def _same_item(item: Json, other: Json, merge_key: str) -> bool:
    if merge_key and isinstance(item, dict):
        return isinstance(other, dict) and merge_key in item and _key_matches(other, merge_key, item[merge_key])
    return _same_scalar(item, other)


def _index_in(items: list, item: Json, merge_key: str) -> int:
    return next((position for position, candidate in enumerate(items) if _same_item(item, candidate, merge_key)), -1)


def _where(path: str) -> str:
    return path.lstrip(".") or "<root>"
