"""JSON merge patch (RFC 7386), as `application/merge-patch+json` on the API server.

Objects merge key by key, `null` removes a key, everything else (arrays included) replaces.
A patch that is not an object replaces the whole target. Inputs are never modified.
"""
from __future__ import annotations

import copy
from typing import Any


def json_merge_patch(target: Any, patch: Any) -> Any:
    """Return `target` with the RFC 7386 `patch` applied."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = json_merge_patch(result.get(key), value)
    return result


def create_merge_patch(source: Any, target: Any) -> Any:
    """The smallest merge patch that turns `source` into `target` (for tests and clients).

    `json_merge_patch(source, create_merge_patch(source, target)) == target` whenever `target`
    contains no `null` values inside objects (a merge patch cannot express those).
    """
    if not isinstance(source, dict) or not isinstance(target, dict):
        return copy.deepcopy(target)
    patch: dict[str, Any] = {key: None for key in source if key not in target}
    for key, value in target.items():
        if key not in source:
            patch[key] = copy.deepcopy(value)
        elif source[key] != value or type(source[key]) is not type(value):
            patch[key] = create_merge_patch(source[key], value)
    return patch
