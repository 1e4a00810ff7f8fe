"""The Kubernetes 1.36 built-in type definitions, and one schema-walking interface for all types.

The definitions come from the JSON-schema bundle that kubernetes-validate ships
(`kubernetes-json-schema/v1.36.0-local/_definitions.json`); they are the upstream OpenAPI
definitions with the extensions we need: `x-kubernetes-patch-strategy`,
`x-kubernetes-patch-merge-key`, `x-kubernetes-list-type`, `x-kubernetes-list-map-keys`,
`x-kubernetes-map-type` and `x-kubernetes-group-version-kind`. The file is read once per process.

`SchemaNode` is the small interface the patch and apply code walk with. It wraps either a
built-in definition (`builtin_schema("io.k8s.api.core.v1.Pod")`) or a CRD's structural
`openAPIV3Schema` (`structural_schema(crd_version["schema"]["openAPIV3Schema"])`), so callers
never care which one they hold.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any, Mapping

KUBERNETES_VERSION = "v1.36.0"
_BUNDLE_FOLDER = f"{KUBERNETES_VERSION}-local"
_REF_PREFIXES = ("#/$defs/", "#/definitions/", "#/components/schemas/")
_OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"


class UnknownDefinitionError(KeyError):
    """A type name that the pinned Kubernetes definitions do not contain."""

    def __str__(self) -> str:
        return f"unknown Kubernetes type definition: {self.args[0]}"


@lru_cache(maxsize=1)
def load_definitions() -> Mapping[str, dict[str, Any]]:
    """All definitions by name (`io.k8s.api.core.v1.PodSpec` -> JSON schema), loaded once."""
    bundle = resources.files("kubernetes_validate") / "kubernetes-json-schema" / _BUNDLE_FOLDER
    document = json.loads((bundle / "_definitions.json").read_text(encoding="utf-8"))
    return document.get("$defs") or document["definitions"]


def definition(name: str) -> dict[str, Any]:
    """The raw definition named `name`; `UnknownDefinitionError` when there is none."""
    try:
        return load_definitions()[name]
    except KeyError:
        raise UnknownDefinitionError(name) from None


def has_definition(name: str) -> bool:
    return name in load_definitions()


def ref_name(ref: str) -> str:
    """`#/$defs/io.k8s.api.core.v1.Pod` -> `io.k8s.api.core.v1.Pod` (also `#/definitions/`)."""
    for prefix in _REF_PREFIXES:
        if ref.startswith(prefix):
            return ref[len(prefix):]
    raise UnknownDefinitionError(ref)


def group_version_kinds(name: str) -> list[tuple[str, str, str]]:
    """The `(group, version, kind)` triples a definition declares (empty for non-root types)."""
    return [
        (gvk.get("group", ""), gvk.get("version", ""), gvk.get("kind", ""))
        for gvk in definition(name).get("x-kubernetes-group-version-kind", [])
    ]


@lru_cache(maxsize=1)
def _definitions_by_gvk() -> dict[tuple[str, str, str], str]:
    index: dict[tuple[str, str, str], str] = {}
    for name, body in load_definitions().items():
        for gvk in body.get("x-kubernetes-group-version-kind", []):
            key = (gvk.get("group", ""), gvk.get("version", ""), gvk.get("kind", ""))
            index.setdefault(key, name)
    return index


def definition_name_for(api_version: str, kind: str) -> str | None:
    """The definition name of a built-in kind: `("v1", "Pod")` -> `io.k8s.api.core.v1.Pod`.

    Returns None for kinds Kubernetes does not define (custom resources).
    """
    group, _, version = api_version.rpartition("/")
    return _definitions_by_gvk().get((group, version, kind))


def _type_names(schema: Mapping[str, Any]) -> set[str]:
    declared = schema.get("type")
    if declared is None:
        return set()
    if isinstance(declared, str):
        return {declared}
    return {name for name in declared if name != "null"}


@dataclass(frozen=True)
class SchemaNode:
    """One position in a type schema, with the list/map/patch semantics the machinery needs.

    `schema` is the JSON schema at this position with any `$ref` already followed (extensions
    written beside the `$ref`, such as a property's patch strategy, are kept). `crd` is True for
    CRD structural schemas, where a list without `x-kubernetes-list-type` is atomic and
    strategic merge patch is not available.
    """

    schema: Mapping[str, Any]
    crd: bool = False
    # Children resolved so far: walking the same type again (every request) costs nothing.
    _children: dict[str, SchemaNode | None] = field(default_factory=dict, compare=False, repr=False)

    # -- navigation -------------------------------------------------------------------------
    def field(self, name: str) -> SchemaNode | None:
        """The schema of struct field `name`, or of a map value; None when unknown."""
        key = "f:" + name
        if key not in self._children:
            self._children[key] = self._resolve_field(name)
        return self._children[key]

    def _resolve_field(self, name: str) -> SchemaNode | None:
        properties = self.schema.get("properties")
        if properties and name in properties:
            return self._child(properties[name])
        additional = self.schema.get("additionalProperties")
        if isinstance(additional, Mapping):
            return self._child(additional)
        return None

    def items(self) -> SchemaNode | None:
        """The schema of list items; None when unknown."""
        if "items" not in self._children:
            items = self.schema.get("items")
            self._children["items"] = self._child(items) if isinstance(items, Mapping) else None
        return self._children["items"]

    def has_field(self, name: str) -> bool:
        """Whether `name` is a declared struct field (not a free-form map key)."""
        return name in (self.schema.get("properties") or {})

    def _child(self, raw: Mapping[str, Any]) -> SchemaNode:
        return SchemaNode(resolve(raw), self.crd)

    # -- shape ------------------------------------------------------------------------------
    @property
    def is_list(self) -> bool:
        return "array" in _type_names(self.schema) or "items" in self.schema

    @property
    def is_struct(self) -> bool:
        """An object with declared properties (fields), as opposed to a free-form map."""
        return bool(self.schema.get("properties"))

    @property
    def is_map(self) -> bool:
        """An object whose keys are data (labels, annotations, resource limits)."""
        return not self.is_struct and (
            isinstance(self.schema.get("additionalProperties"), Mapping)
            or self.preserves_unknown_fields
        )

    @property
    def preserves_unknown_fields(self) -> bool:
        return bool(self.schema.get("x-kubernetes-preserve-unknown-fields"))

    # -- list and map semantics (server-side apply) -----------------------------------------
    @property
    def list_type(self) -> str:
        """`atomic`, `set` or `map`, with the upstream defaults for lists that declare none.

        A built-in list that only carries a patch strategy is treated the way the upstream
        OpenAPI-to-SMD conversion does: `merge` with a merge key -> map, `merge` on scalars -> set.
        CRD lists without a list type are atomic.
        """
        declared = self.schema.get("x-kubernetes-list-type")
        if declared:
            return str(declared)
        if not self.crd and "merge" in self.patch_strategies:
            return "map" if self.patch_merge_key else "set"
        return "atomic"

    @property
    def list_map_keys(self) -> tuple[str, ...]:
        keys = self.schema.get("x-kubernetes-list-map-keys")
        if keys:
            return tuple(keys)
        merge_key = self.patch_merge_key
        return (merge_key,) if merge_key else ()

    @property
    def map_type(self) -> str:
        """`atomic` or `granular` (the default) for objects."""
        return str(self.schema.get("x-kubernetes-map-type") or "granular")

    # -- strategic merge patch semantics ----------------------------------------------------
    @property
    def patch_strategies(self) -> tuple[str, ...]:
        raw = self.schema.get("x-kubernetes-patch-strategy") or ""
        return tuple(part.strip() for part in str(raw).split(",") if part.strip())

    @property
    def patch_merge_key(self) -> str:
        return str(self.schema.get("x-kubernetes-patch-merge-key") or "")


def resolve(schema: Mapping[str, Any]) -> Mapping[str, Any]:
    """Follow `$ref` (and a single-`$ref` `allOf`) to the definition, keeping the extensions
    written beside the reference (a property's own `x-kubernetes-*` wins over the target's)."""
    reference = schema.get("$ref")
    if reference is None:
        all_of = schema.get("allOf")
        if isinstance(all_of, list) and len(all_of) == 1 and "$ref" in all_of[0]:
            reference = all_of[0]["$ref"]
    if reference is None:
        return schema
    target = _resolved_definition(ref_name(reference))
    local = {key: value for key, value in schema.items() if key not in ("$ref", "allOf")}
    return {**target, **local}


@lru_cache(maxsize=None)
def _resolved_definition(name: str) -> Mapping[str, Any]:
    return resolve(definition(name))


@lru_cache(maxsize=None)
def builtin_schema(type_name: str) -> SchemaNode:
    """The schema walker of a built-in type, e.g. `io.k8s.api.core.v1.PodTemplateSpec`.

    One shared walker per type (its resolved children are cached): treat it as read-only.
    """
    if not has_definition(type_name):
        raise UnknownDefinitionError(type_name)
    return SchemaNode(_resolved_definition(type_name), crd=False)


def structural_schema(open_api_v3_schema: Mapping[str, Any]) -> SchemaNode:
    """The schema walker of a custom resource from its CRD version's `openAPIV3Schema`.

    `metadata` is ObjectMeta whatever the CRD says (the API server always treats it so), and the
    top-level `apiVersion`/`kind` are plain strings.
    """
    properties = dict(open_api_v3_schema.get("properties") or {})
    properties["metadata"] = {"$ref": f"#/$defs/{_OBJECT_META}"}
    return SchemaNode({**open_api_v3_schema, "type": "object", "properties": properties}, crd=True)


# A schema for values nobody described: maps merge per key, lists are atomic.
UNTYPED = SchemaNode({"type": "object", "x-kubernetes-preserve-unknown-fields": True}, crd=True)
