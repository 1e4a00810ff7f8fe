"""Server-side apply and managedFields bookkeeping (structured-merge-diff semantics).

Two entry points, both pure (the API server does storage, preconditions and defaulting):

- `apply(live, config, manager=..., schema=..., now=..., force=False, subresource="",
  status_is_subresource=False) -> ApplyResult` — an `application/apply-patch+yaml` request.
  Merges `config` into `live` (None = create), gives `manager` an `Apply` entry owning exactly the
  config's fields, removes fields the manager applied last time and nobody owns any more, and
  raises `ApplyConflict` when a changed field is owned by another manager (unless `force`, which
  takes the fields over).
- `record_update(live, new, manager=..., schema=..., now=..., subresource="") -> dict` — any other
  write (create, PUT, merge/JSON/strategic patch): `manager`'s `Update` entry gains the fields the
  write added or changed; those leave every other entry; removed fields leave all entries.

`schema` is a `SchemaNode`: `builtin_schema("io.k8s.api.core.v1.Pod")` for built-in kinds,
`structural_schema(openAPIV3Schema)` for custom resources (their lists without
`x-kubernetes-list-type` are atomic). `subresource="status"` writes only touch `status`;
`status_is_subresource=True` makes main-resource applies ignore `status`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

from trainyard.apimachinery.errors import MachineryError
from trainyard.apimachinery.fieldpath import (
    FieldSet,
    Path,
    PathElement,
    format_path,
    from_fields_v1,
    key_element,
    path_sort_key,
    to_fields_v1,
    value_element,
)
from trainyard.apimachinery.json_patch import json_equal
from trainyard.apimachinery.openapi_definitions import UNTYPED, SchemaNode

APPLY = "Apply"
UPDATE = "Update"
KUBECTL_MANAGER = "kubectl"  # `kubectl apply --server-side`'s default field manager
LAST_APPLIED_ANNOTATION = "kubectl.kubernetes.io/last-applied-configuration"

# Never owned by anyone (upstream strips them before computing field sets).
_UNOWNED_PATHS: frozenset[Path] = frozenset(
    {(("f", "apiVersion"),), (("f", "kind"),), (("f", "metadata"),)}
    | {(("f", "metadata"), ("f", name)) for name in (
        "name", "namespace", "creationTimestamp", "selfLink", "uid", "clusterName",
        "generation", "managedFields", "resourceVersion")}
)
# Set by the server, never taken from an applied configuration.
_SERVER_METADATA = ("managedFields", "resourceVersion", "uid", "creationTimestamp", "generation", "selfLink",
                    "deletionTimestamp", "deletionGracePeriodSeconds")
# Key fields that the API server defaults before apply runs (so items are keyed the same way).
_KEY_FIELD_DEFAULTS = {"protocol": "TCP"}
_STATUS: Path = (("f", "status"),)


class ApplyError(MachineryError):
    """An applied configuration that cannot be merged (e.g. a list item without its key)."""


@dataclass(frozen=True)
class Conflict:
    manager: str  # as printed: `"name"` + ` with subresource "status"` + ` using v1 at <time>`
    path: Path

    @property
    def field(self) -> str:
        return format_path(self.path)


class ApplyConflict(MachineryError):
    """The apply would change fields other managers own (HTTP 409, reason Conflict)."""

    def __init__(self, conflicts: list[Conflict]) -> None:
        self.conflicts = sorted(conflicts, key=lambda conflict: (conflict.manager, path_sort_key(conflict.path)))
        super().__init__(conflict_message(self.conflicts))

    def causes(self) -> list[dict[str, str]]:
        """`details.causes` of the Status: reason FieldManagerConflict per field."""
        return [
            {"reason": "FieldManagerConflict", "message": f"conflict with {conflict.manager}", "field": conflict.field}
            for conflict in self.conflicts
        ]


def conflict_message(conflicts: list[Conflict]) -> str:
    """The API server's wording: one conflict inline, several grouped per manager."""
    if len(conflicts) == 1:
        return f"Apply failed with 1 conflict: conflict with {conflicts[0].manager}: {conflicts[0].field}"
    lines: list[str] = []
    for manager in sorted({conflict.manager for conflict in conflicts}):
        lines.append(f"conflicts with {manager}:")
        lines.extend(f"- {conflict.field}" for conflict in conflicts if conflict.manager == manager)
    return f"Apply failed with {len(conflicts)} conflicts: " + "\n".join(lines)


@dataclass
class ManagedFieldsEntry:
    manager: str
    operation: str
    api_version: str
    fields: FieldSet
    time: str | None = None
    subresource: str = ""

    @property
    def identity(self) -> tuple[str, str, str, str]:
        """Upstream keeps one entry per manager+operation+subresource (+apiVersion for Update)."""
        return (self.manager, self.operation, self.subresource, self.api_version if self.operation == UPDATE else "")

    def printed(self) -> str:
        text = _quote(self.manager)
        if self.subresource:
            text += f" with subresource {_quote(self.subresource)}"
        if self.operation == UPDATE:
            text += f" using {self.api_version}"
            if self.time:
                text += f" at {self.time}"
        return text

    def to_json(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"manager": self.manager, "operation": self.operation, "apiVersion": self.api_version}
        if self.time:
            entry["time"] = self.time
        entry["fieldsType"] = "FieldsV1"
        entry["fieldsV1"] = _fields_v1(self.fields)
        if self.subresource:
            entry["subresource"] = self.subresource
        return entry


# FieldsV1 trees by field set: objects of one kind written by one client mostly have the same
# field sets, and building a tree (sorting paths, ordering every level) costs more than the rest
# of an entry. Bounded; kept as JSON text, so every caller gets its own tree (decoding the text
# is cheaper than copying a tree).
_FIELDS_V1_CACHE: dict[frozenset[Path], str] = {}
_FIELDS_V1_CACHE_SIZE = 4096


def _fields_v1(fields: FieldSet) -> dict[str, Any]:
    key = frozenset(fields)
    text = _FIELDS_V1_CACHE.get(key)
    if text is None:
        text = json.dumps(to_fields_v1(key), ensure_ascii=False)
        if len(_FIELDS_V1_CACHE) >= _FIELDS_V1_CACHE_SIZE:
            _FIELDS_V1_CACHE.clear()
        _FIELDS_V1_CACHE[key] = text
    return json.loads(text)


# Field sets by FieldsV1 text, for the same reason (decoding walks and parses every key).
_FIELD_SETS_CACHE: dict[str, frozenset[Path]] = {}


def _decoded_fields(tree: Any) -> FieldSet:
    if not isinstance(tree, dict):
        return from_fields_v1(tree)  # names the problem
    try:
        key = json.dumps(tree, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError):
        return from_fields_v1(tree)
    fields = _FIELD_SETS_CACHE.get(key)
    if fields is None:
        fields = frozenset(from_fields_v1(tree))  # a malformed tree raises and is not cached
        if len(_FIELD_SETS_CACHE) >= _FIELDS_V1_CACHE_SIZE:
            _FIELD_SETS_CACHE.clear()
        _FIELD_SETS_CACHE[key] = fields
    return set(fields)


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def decode_managed_fields(entries: Any) -> list[ManagedFieldsEntry]:
    """`metadata.managedFields` (JSON) -> entries; `MachineryError` names a malformed entry."""
    decoded = []
    for index, entry in enumerate(entries or []):
        if not isinstance(entry, Mapping) or not isinstance(entry.get("manager", ""), str):
            raise MachineryError(f"metadata.managedFields[{index}]: must be an object with a manager")
        if entry.get("fieldsType", "FieldsV1") != "FieldsV1":
            raise MachineryError(f"metadata.managedFields[{index}].fieldsType: only FieldsV1 is supported")
        decoded.append(ManagedFieldsEntry(
            manager=str(entry.get("manager", "")),
            operation=str(entry.get("operation", UPDATE)),
            api_version=str(entry.get("apiVersion", "")),
            fields=_decoded_fields(entry.get("fieldsV1") or {}),
            time=entry.get("time"),
            subresource=str(entry.get("subresource", "")),
        ))
    return decoded


MAX_UPDATE_ENTRIES = 10
ANCIENT_CHANGES = "ancient-changes"


def cap_update_entries(entries: list[ManagedFieldsEntry], limit: int = MAX_UPDATE_ENTRIES) -> list[ManagedFieldsEntry]:
    """Keep at most `limit` Update entries: the oldest are folded, per apiVersion, into one
    `ancient-changes` entry (upstream `capmanagers`), so managedFields cannot grow forever."""
    updates = sorted((entry for entry in entries if entry.operation == UPDATE and entry.fields),
                     key=lambda entry: (entry.time or "", entry.manager))
    excess = len(updates) - limit
    if excess <= 0:
        return entries
    kept = list(entries)
    first_of_version: dict[str, ManagedFieldsEntry] = {}
    for entry in updates:
        if excess <= 0:
            break
        first = first_of_version.get(entry.api_version)
        if first is None:
            first_of_version[entry.api_version] = entry
            continue
        if first.manager != ANCIENT_CHANGES or first.subresource:
            bucket = ManagedFieldsEntry(ANCIENT_CHANGES, UPDATE, entry.api_version, set(first.fields), first.time)
            kept = [bucket if candidate is first else candidate for candidate in kept]
            first_of_version[entry.api_version] = first = bucket
        first.fields |= entry.fields
        first.time = entry.time  # the bucket carries the newest time folded into it
        kept = [candidate for candidate in kept if candidate is not entry]
        excess -= 1
    return kept


def encode_managed_fields(entries: list[ManagedFieldsEntry]) -> list[dict[str, Any]]:
    """Entries -> JSON, in upstream's order (operation, time, manager, apiVersion, subresource)."""
    ordered = sorted(
        (entry for entry in cap_update_entries(entries) if entry.fields),
        key=lambda e: (e.operation, e.time or "", e.manager, e.api_version, e.subresource),
    )
    return [entry.to_json() for entry in ordered]


@dataclass
class ApplyResult:
    object: dict[str, Any]
    changed: bool  # False: nothing to write (same object and managedFields), keep the resourceVersion
    created: bool = False
    forced: list[Conflict] = field(default_factory=list)


# -- public operations -----------------------------------------------------------------------


def apply(
    live: dict[str, Any] | None,
    config: dict[str, Any],
    *,
    manager: str,
    schema: SchemaNode,
    now: str,
    force: bool = False,
    subresource: str = "",
    status_is_subresource: bool = False,
) -> ApplyResult:
    """Server-side apply `config` to `live` (None creates). See the module docstring."""
    if not manager:
        raise ApplyError("fieldManager: Required value: is required for apply patch")
    if not isinstance(config, dict):
        raise ApplyError("the applied configuration must be a JSON object")
    if isinstance(config.get("metadata"), dict) and config["metadata"].get("managedFields") is not None:
        raise ApplyError("metadata.managedFields must be nil")
    created = live is None
    # `live` is only read: `live_object` and `merged` share the subtrees the apply leaves alone
    # (copy-on-write), which also lets `_compare` skip them; the result is copied once at the end.
    live_object = _shallow_without_managed_fields(live or {})
    entries = decode_managed_fields(((live or {}).get("metadata") or {}).get("managedFields"))
    scoped_config = _scope_config(config, subresource, status_is_subresource)
    merged = _merge(live_object, scoped_config, schema, ())
    if subresource == "status" or status_is_subresource:
        merged = _restore_out_of_scope(merged, live_object, subresource)
    applied = _owned_in_scope(_to_field_set(scoped_config, schema), subresource, status_is_subresource)

    apply_identity = (manager, APPLY, subresource, "")
    previous = next((entry for entry in entries if entry.identity == apply_identity), None)
    last_applied = previous.fields if previous else set()
    entries = [entry for entry in entries if entry.identity != apply_identity]
    mine = ManagedFieldsEntry(manager, APPLY, str(config.get("apiVersion", "")), applied,
                              previous.time if previous else None, subresource)

    # Nothing can be stale when the manager applies (a superset of) what it applied last time:
    # the stale set is monotone in the fields, so `last_applied <= applied` makes it empty.
    if last_applied and not last_applied <= applied:
        everyone = set(applied).union(*(entry.fields for entry in entries))
        merged = _prune(merged, schema, last_applied, everyone)

    if created:
        # Nothing is live: no other manager owns a field (no conflicts), and the object is new
        # whatever a comparison would find, so there is nothing to compare.
        added, removed, modified = set(), set(), set()
    else:
        added, removed, modified = _compare(live_object, merged, schema)
    changed_fields = added | modified
    conflicts = [
        Conflict(entry.printed(), path)
        for entry in entries
        for path in sorted(entry.fields & changed_fields, key=path_sort_key)
    ]
    if conflicts and not force:
        _raise_unless_upgrading_client_side_apply(conflicts, live_object, schema, manager, subresource)
    for entry in entries:
        entry.fields = entry.fields - changed_fields - removed
    # Any field the comparison found added, removed or modified means the objects differ;
    # only when it found none (or the annotation sync replaced the object) is a full
    # comparison needed (e.g. the order of an associative list).
    known_changed = bool(added or removed or modified)
    if manager == KUBECTL_MANAGER and not subresource:
        synced = _sync_last_applied(merged, config)
        if synced is not merged:
            merged, known_changed = synced, False
    object_changed = known_changed or not json_equal(live_object, merged)
    if object_changed or previous is None:
        mine.time = now
    new_entries = [entry for entry in entries if entry.fields] + [mine]
    result = _with_managed_fields(json_copy(merged), encode_managed_fields(new_entries))
    changed = created or object_changed or result["metadata"].get("managedFields") != (
        ((live or {}).get("metadata") or {}).get("managedFields"))
    return ApplyResult(result, changed, created, conflicts if force else [])


def _raise_unless_upgrading_client_side_apply(conflicts: list[Conflict], live: dict[str, Any], schema: SchemaNode,
                                              manager: str, subresource: str) -> None:
    """Upstream's upgrade path from `kubectl apply` to `kubectl apply --server-side`: for the manager
    `kubectl`, conflicts on fields the last-applied-configuration annotation still describes
    (same value in the object) are taken over silently; any other conflict fails as usual."""
    allowed = _last_applied_fields(live, schema) if manager == KUBECTL_MANAGER and not subresource else set()
    remaining = [conflict for conflict in conflicts if conflict.path not in allowed]
    if remaining:
        raise ApplyConflict(remaining)


def _last_applied_fields(live: dict[str, Any], schema: SchemaNode) -> FieldSet:
    annotation = ((live.get("metadata") or {}).get("annotations") or {}).get(LAST_APPLIED_ANNOTATION)
    try:
        last_applied = json.loads(annotation) if annotation else None
    except ValueError:
        return set()
    if not isinstance(last_applied, dict):
        return set()
    try:
        fields = _to_field_set(last_applied, schema)
        _, _, modified = _compare(last_applied, live, schema)
    except MachineryError:
        return set()
    return fields - modified


def _sync_last_applied(merged: dict[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
    """Keep an existing last-applied-configuration annotation equal to what `kubectl` applied."""
    annotations = (merged.get("metadata") or {}).get("annotations") or {}
    if LAST_APPLIED_ANNOTATION not in annotations:
        return merged
    applied = dict(config)
    if isinstance(applied.get("metadata"), dict) and isinstance(applied["metadata"].get("annotations"), dict):
        applied_annotations = dict(applied["metadata"]["annotations"])
        applied_annotations.pop(LAST_APPLIED_ANNOTATION, None)
        applied["metadata"] = {**applied["metadata"], "annotations": applied_annotations}
    text = json.dumps(applied, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    metadata = {**merged["metadata"], "annotations": {**annotations, LAST_APPLIED_ANNOTATION: text}}
    return {**merged, "metadata": metadata}


def record_update(
    live: dict[str, Any] | None,
    new: dict[str, Any],
    *,
    manager: str,
    schema: SchemaNode,
    now: str,
    subresource: str = "",
) -> dict[str, Any]:
    """`new` with managedFields updated for a non-apply write by `manager` (None live = create).

    Like upstream, a main-resource write may set managedFields itself: `[{}]` clears them, other
    non-empty valid entries replace live's; otherwise (and for subresources) live's are the base.
    """
    live_object = _without_managed_fields(live or {})
    new_object = _without_managed_fields(new)
    entries = _base_entries(live, new, subresource)
    added, removed, modified = _compare(live_object, new_object, schema)
    changed_fields = _owned_in_scope(added | modified, subresource, False)
    removed = _owned_in_scope(removed, subresource, False)
    api_version = str(new.get("apiVersion", ""))
    identity = (manager, UPDATE, subresource, api_version)
    mine = next((entry for entry in entries if entry.identity == identity), None)
    if mine is None:
        mine = ManagedFieldsEntry(manager, UPDATE, api_version, set(), None, subresource)
        entries.append(mine)
    for entry in entries:
        entry.fields = entry.fields - removed - (changed_fields if entry is not mine else set())
    if changed_fields:
        mine.fields = mine.fields | changed_fields
        mine.time = now
    return _with_managed_fields(new_object, encode_managed_fields(entries))


def _base_entries(live: Mapping[str, Any] | None, new: Mapping[str, Any], subresource: str) -> list[ManagedFieldsEntry]:
    live_entries = ((live or {}).get("metadata") or {}).get("managedFields")
    requested = (new.get("metadata") or {}).get("managedFields") if isinstance(new.get("metadata"), Mapping) else None
    if subresource or not requested or requested == live_entries:
        return decode_managed_fields(live_entries)
    if requested == [{}]:
        return []
    try:
        return decode_managed_fields(requested) or decode_managed_fields(live_entries)
    except MachineryError:
        return decode_managed_fields(live_entries)


def owned_fields(obj: Mapping[str, Any], schema: SchemaNode) -> FieldSet:
    """The fields an applied configuration `obj` would own (upstream `ToFieldSet`)."""
    return _to_field_set(obj, schema)


# -- scoping ---------------------------------------------------------------------------------


def _scope_config(config: Mapping[str, Any], subresource: str, status_is_subresource: bool) -> dict[str, Any]:
    # Shallow: only the top level and metadata are edited here, and `_merge` copies what it
    # takes from the configuration (`_drop_nulls`), so the caller's config is never changed.
    scoped = dict(config)
    metadata = scoped.get("metadata")
    if isinstance(metadata, dict):
        metadata = scoped["metadata"] = dict(metadata)
        for name in _SERVER_METADATA:
            metadata.pop(name, None)
    if subresource == "status":
        identity = {key: scoped[key] for key in ("apiVersion", "kind") if key in scoped}
        names = {key: metadata[key] for key in ("name", "namespace") if isinstance(metadata, dict) and key in metadata}
        return {**identity, "metadata": names, **({"status": scoped["status"]} if "status" in scoped else {})}
    if status_is_subresource:
        scoped.pop("status", None)
    return scoped


def _restore_out_of_scope(merged: dict[str, Any], live: dict[str, Any], subresource: str) -> dict[str, Any]:
    """Status writes keep everything but status from live; main writes keep live's status."""
    if subresource == "status":
        restored = dict(live) if live else {key: merged[key] for key in ("apiVersion", "kind", "metadata") if key in merged}
        if "status" in merged:
            restored["status"] = merged["status"]
        else:
            restored.pop("status", None)
        return restored
    restored = dict(merged)
    restored.pop("status", None)
    if "status" in live:
        restored["status"] = live["status"]  # shared with live; `apply` copies its result
    return restored


def _owned_in_scope(fields: FieldSet, subresource: str, status_is_subresource: bool) -> FieldSet:
    fields = {path for path in fields if path not in _UNOWNED_PATHS}
    if subresource == "status":
        return {path for path in fields if path[:1] == _STATUS}
    if status_is_subresource:
        return {path for path in fields if path[:1] != _STATUS}
    return fields


def json_copy(value: Any) -> Any:
    """A deep copy of a JSON value (dicts, lists, scalars): several times cheaper than
    `copy.deepcopy`, which handles any object graph (memo, reductions) that JSON never has."""
    if isinstance(value, dict):
        return {key: json_copy(child) for key, child in value.items()}
    if isinstance(value, list):
        return [json_copy(child) for child in value]
    return value


def _without_managed_fields(obj: Mapping[str, Any]) -> dict[str, Any]:
    result = json_copy(dict(obj))
    metadata = result.get("metadata")
    if isinstance(metadata, dict):
        metadata.pop("managedFields", None)
    return result


def _shallow_without_managed_fields(obj: Mapping[str, Any]) -> dict[str, Any]:
    """`obj` without managedFields, sharing everything else with `obj` (treat as read-only)."""
    result = dict(obj)
    metadata = result.get("metadata")
    if isinstance(metadata, dict) and "managedFields" in metadata:
        result["metadata"] = {key: value for key, value in metadata.items() if key != "managedFields"}
    return result


def _with_managed_fields(obj: dict[str, Any], managed: list[dict[str, Any]]) -> dict[str, Any]:
    result = dict(obj)
    metadata = dict(result.get("metadata") or {})
    if managed:
        metadata["managedFields"] = managed
    else:
        metadata.pop("managedFields", None)
    result["metadata"] = metadata
    return result


# -- walking values with a schema ------------------------------------------------------------


def _child_schema(schema: SchemaNode, key: str) -> SchemaNode:
    return schema.field(key) or UNTYPED


def _is_declared_field(schema: SchemaNode, key: str) -> bool:
    return schema.has_field(key)


def _is_atomic(value: Any, schema: SchemaNode) -> bool:
    if isinstance(value, dict):
        return schema.map_type == "atomic"
    if isinstance(value, list):
        return schema.list_type == "atomic"
    return True


def _item_element(item: Any, schema: SchemaNode, index: int, path: Path) -> PathElement:
    if schema.list_type == "set":
        return value_element(item)
    if schema.list_type != "map":
        return ("i", str(index))
    keys = schema.list_map_keys
    if not isinstance(item, dict):
        raise ApplyError(f"{format_path(path)}[{index}]: items of this list must be objects keyed by {', '.join(keys)}")
    key_fields = {}
    for key in keys:
        if key in item:
            key_fields[key] = item[key]
        elif key in _KEY_FIELD_DEFAULTS:
            key_fields[key] = _KEY_FIELD_DEFAULTS[key]
    if not key_fields:
        raise ApplyError(f"{format_path(path)}[{index}]: list item is missing its key field(s) {', '.join(keys)}")
    return key_element(key_fields)


def _list_items(value: list, schema: SchemaNode, path: Path) -> list[tuple[PathElement, Any]]:
    return [(_item_element(item, schema, index, path), item) for index, item in enumerate(value)]


def _children(value: Any, schema: SchemaNode, path: Path) -> Iterator[tuple[PathElement, Any, SchemaNode]]:
    """The owned-granularity children of a non-atomic map or list."""
    if isinstance(value, dict):
        for key, child in value.items():
            yield ("f", key), child, _child_schema(schema, key)
    elif isinstance(value, list):
        item_schema = schema.items() or UNTYPED
        for element, item in _list_items(value, schema, path):
            yield element, item, item_schema


def _to_field_set(value: Mapping[str, Any], schema: SchemaNode) -> FieldSet:
    fields: FieldSet = set()
    _collect_owned(dict(value), schema, (), fields)
    return fields


def _collect_owned(value: Any, schema: SchemaNode, path: Path, fields: FieldSet) -> None:
    if not isinstance(value, (dict, list)):
        fields.add(path)
        return
    if _is_atomic(value, schema):
        fields.add(path)
        return
    if isinstance(value, list):
        # the items' path elements once, for the duplicate check and the walk (a map list's
        # key elements are the costly part of a field set)
        items = _list_items(value, schema, path)
        _check_unique_items(items, path)
        item_schema = schema.items() or UNTYPED
        for element, item in items:
            item_path = path + (element,)
            _collect_owned(item, item_schema, item_path, fields)
            fields.add(item_path)  # a list item is a member whatever it holds
        return
    for key, child in value.items():
        child_path = path + (("f", key),)
        _collect_owned(child, _child_schema(schema, key), child_path, fields)
        if child is None or (isinstance(child, dict) and not child) or not _is_declared_field(schema, key):
            fields.add(child_path)


def _all_nodes(value: Any, schema: SchemaNode, path: Path, fields: FieldSet) -> None:
    fields.add(path)
    if isinstance(value, (dict, list)) and not _is_atomic(value, schema):
        for element, child, child_schema in _children(value, schema, path):
            _all_nodes(child, child_schema, path + (element,), fields)


def _compare(old: Any, new: Any, schema: SchemaNode) -> tuple[FieldSet, FieldSet, FieldSet]:
    added: FieldSet = set()
    removed: FieldSet = set()
    modified: FieldSet = set()
    _compare_at(old, new, schema, (), added, removed, modified)
    return added, removed, modified


def _compare_at(old: Any, new: Any, schema: SchemaNode, path: Path,
                added: FieldSet, removed: FieldSet, modified: FieldSet) -> None:
    if old is new:
        return  # a subtree shared by both sides (copy-on-write merge) has not changed
    same_shape = (isinstance(old, dict) and isinstance(new, dict)) or (isinstance(old, list) and isinstance(new, list))
    if not same_shape or _is_atomic(new, schema):
        if not json_equal(old, new):
            modified.add(path)
        return
    if isinstance(new, dict):
        _compare_maps(old, new, schema, path, added, removed, modified)
        return
    old_children = {element: (child, child_schema) for element, child, child_schema in _children(old, schema, path)}
    new_children = {element: (child, child_schema) for element, child, child_schema in _children(new, schema, path)}
    for element, (child, child_schema) in old_children.items():
        if element not in new_children:
            _all_nodes(child, child_schema, path + (element,), removed)
    for element, (child, child_schema) in new_children.items():
        if element not in old_children:
            _all_nodes(child, child_schema, path + (element,), added)
        else:
            _compare_at(old_children[element][0], child, child_schema, path + (element,), added, removed, modified)


def _compare_maps(old: dict, new: dict, schema: SchemaNode, path: Path,
                  added: FieldSet, removed: FieldSet, modified: FieldSet) -> None:
    """`_compare_at` for two maps, without building the children lists (the common case)."""
    for key, child in old.items():
        if key not in new:
            _all_nodes(child, _child_schema(schema, key), path + (("f", key),), removed)
    for key, child in new.items():
        if key not in old:
            _all_nodes(child, _child_schema(schema, key), path + (("f", key),), added)
        else:
            _compare_at(old[key], child, _child_schema(schema, key), path + (("f", key),), added, removed, modified)


# -- merging an applied configuration --------------------------------------------------------


def _merge(live: Any, config: Any, schema: SchemaNode, path: Path) -> Any:
    """Merge `config` into `live` without changing either: maps and lists the configuration
    changes are new; everything it leaves as it was is `live`'s own value (copy-on-write), so
    `_compare` skips it by identity."""
    if isinstance(live, dict) and isinstance(config, dict) and not _is_atomic(config, schema):
        merged = dict(live)
        unchanged = True
        for key, value in config.items():
            if value is None:
                if key in merged:
                    del merged[key]  # applying null owns the field and leaves it unset
                    unchanged = False
            elif key in merged:
                child = merged[key]
                merged_child = _merge(child, value, _child_schema(schema, key), path + (("f", key),))
                if merged_child is not child:
                    merged[key] = merged_child
                    unchanged = False
            else:
                merged[key] = _drop_nulls(value)
                unchanged = False
        return live if unchanged else merged
    if isinstance(live, list) and isinstance(config, list) and not _is_atomic(config, schema):
        merged_list = _merge_list(live, config, schema, path)
        if len(merged_list) == len(live) and all(new is old for new, old in zip(merged_list, live)):
            return live
        return merged_list
    if _same_scalar(live, config):
        return live
    return _drop_nulls(config)


def _same_scalar(live: Any, config: Any) -> bool:
    """The same JSON scalar, type included (so `1` never replaces `1.0` or `true`)."""
    return type(live) is type(config) and isinstance(config, (str, int, float)) and live == config


def _merge_list(live: list, config: list, schema: SchemaNode, path: Path) -> list:
    item_schema = schema.items() or UNTYPED
    live_items = _list_items(live, schema, path)
    config_items = _list_items(config, schema, path)
    _check_unique_items(config_items, path)
    live_by_key = {element: item for element, item in live_items}
    config_by_key = {element: item for element, item in config_items}
    result = []
    for element in _merged_order([e for e, _ in live_items], [e for e, _ in config_items]):
        if element in config_by_key and element in live_by_key:
            result.append(_merge(live_by_key[element], config_by_key[element], item_schema, path + (element,)))
        elif element in config_by_key:
            result.append(_drop_nulls(config_by_key[element]))
        else:
            result.append(live_by_key[element])
    return result


def _merged_order(live: list[PathElement], config: list[PathElement]) -> list[PathElement]:
    """Upstream's order for merged associative lists: live order, except that items present in
    both follow the config's order; config-only items go where the config puts them."""
    in_config = set(config)
    in_live = set(live)
    shared = [element for element in config if element in in_live]
    next_shared = shared.pop(0) if shared else None
    out: list[PathElement] = []
    taken: set[PathElement] = set()
    left = right = 0
    while left < len(live) or right < len(config):
        if left < len(live) and right < len(config):
            if live[left] == config[right]:
                out.append(live[left])
                taken.add(live[left])
                left += 1
                right += 1
                next_shared = shared.pop(0) if shared else None
                continue
            if live[left] in in_config and next_shared is not None and live[left] != next_shared:
                left += 1
                continue
        if left < len(live):
            if live[left] not in in_config:
                out.append(live[left])
                left += 1
                continue
            if live[left] in taken:
                left += 1
                continue
        if right < len(config):
            element = config[right]
            out.append(element)
            taken.add(element)
            right += 1
            if next_shared is not None and next_shared == element:
                next_shared = shared.pop(0) if shared else None
    return out


def _check_unique_items(items: list[tuple[PathElement, Any]], path: Path) -> None:
    seen: set[PathElement] = set()
    for element, _ in items:
        if element in seen:
            raise ApplyError(f"{format_path(path + (element,))}: duplicate entries for this key in the applied list")
        seen.add(element)


def _drop_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _drop_nulls(child) for key, child in value.items() if child is not None}
    if isinstance(value, list):
        return [_drop_nulls(child) for child in value]
    return value


# -- pruning fields a manager stopped applying -----------------------------------------------


def _prune(merged: dict[str, Any], schema: SchemaNode, last_applied: FieldSet, everyone: FieldSet) -> dict[str, Any]:
    """Remove what `last_applied` owned that no current entry (the new apply included) owns.

    Struct fields that lead to owned fields count as owned (upstream's
    `EnsureNamedFieldsAreMembers`), so a struct disappears with its last applied field only
    when nobody owns anything inside it.
    """
    stale = _with_named_parents(last_applied, schema) - _with_named_parents(everyone, schema)
    result = dict(merged)  # `_remove_path` copies what it changes below the top level
    for path in sorted(stale, key=len):
        _remove_path(result, path, schema)
    return result


def _with_named_parents(fields: FieldSet, schema: SchemaNode) -> FieldSet:
    expanded = set(fields)
    schema_at: dict[Path, SchemaNode] = {(): schema}
    for path in fields:
        for depth in range(len(path) - 1):
            prefix, (kind, text) = path[:depth], path[depth]
            parent = schema_at[prefix]
            if kind == "f" and _is_declared_field(parent, text):
                expanded.add(path[: depth + 1])
            if path[: depth + 1] not in schema_at:
                schema_at[path[: depth + 1]] = _child_schema(parent, text) if kind == "f" else (parent.items() or UNTYPED)
    return expanded


def _remove_path(obj: Any, path: Path, schema: SchemaNode) -> None:
    """Remove `path` from `obj` (a private top-level map whose children may be shared with
    another object): every map or list on the way down is replaced by a copy before changing."""
    container, current_schema = obj, schema
    for depth, (kind, text) in enumerate(path):
        last = depth == len(path) - 1
        if kind == "f":
            if not isinstance(container, dict) or text not in container:
                return
            if last:
                del container[text]
                return
            child = container[text] = _shallow_copy(container[text])
            container, current_schema = child, _child_schema(current_schema, text)
            continue
        if not isinstance(container, list):
            return
        position = _find_item(container, current_schema, (kind, text), path[:depth])
        if position is None:
            return
        if last:
            del container[position]
            return
        child = container[position] = _shallow_copy(container[position])
        container, current_schema = child, current_schema.items() or UNTYPED


def _shallow_copy(value: Any) -> Any:
    if isinstance(value, dict):
        return dict(value)
    if isinstance(value, list):
        return list(value)
    return value


def _find_item(items: list, schema: SchemaNode, element: PathElement, path: Path) -> int | None:
    if element[0] == "i":
        index = int(element[1])
        return index if index < len(items) else None
    for position, (candidate, _) in enumerate(_list_items(items, schema, path)):
        if candidate == element:
            return position
    return None
