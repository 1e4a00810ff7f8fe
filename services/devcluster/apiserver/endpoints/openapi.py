"""OpenAPI v3 documents per group-version, from the Kubernetes definitions and installed CRDs.

kubectl reads them for ``explain``, for deciding that field validation happens on the server
(a PATCH operation with a ``fieldValidation`` parameter per resource) and for ``apply``.
"""
from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

from trainyard.apimachinery import openapi_definitions

from ..registry.kinds import Registry, ResourceType

_OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
_REF_PREFIX = "#/components/schemas/"


def _definitions() -> Any:
    return openapi_definitions.load_definitions()


def _convert(schema: Any) -> Any:
    """JSON-schema bundle form -> OpenAPI 3.0: ``$defs`` refs, ``["string","null"]`` types."""
    if isinstance(schema, list):
        return [_convert(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "$ref" and isinstance(value, str):
            out["allOf"] = [{"$ref": _REF_PREFIX + value.rsplit("/", 1)[-1]}]
        elif key == "type" and isinstance(value, list):
            types = [t for t in value if t != "null"]
            if types:
                out["type"] = types[0]
        elif key in ("properties", "patternProperties") and isinstance(value, dict):
            out[key] = {k: _convert(v) for k, v in value.items()}
        elif key == "enum" and isinstance(value, list):
            out[key] = [v for v in value if v is not None]
        else:
            out[key] = _convert(value)
    if "allOf" in out and "$ref" not in schema:
        pass
    return out


def _refs(schema: Any, found: set[str]) -> None:
    if isinstance(schema, dict):
        ref = schema.get("$ref")
        if isinstance(ref, str):
            found.add(ref.rsplit("/", 1)[-1])
        for value in schema.values():
            _refs(value, found)
    elif isinstance(schema, list):
        for value in schema:
            _refs(value, found)


def _closure(names: list[str]) -> dict[str, Any]:
    defs = _definitions()
    out: dict[str, Any] = {}
    todo = list(names)
    while todo:
        name = todo.pop()
        if name in out or name not in defs:
            continue
        out[name] = defs[name]
        found: set[str] = set()
        _refs(defs[name], found)
        todo.extend(found - set(out))
    return out


def _cr_schema_name(rt: ResourceType) -> str:
    reversed_group = ".".join(reversed(rt.group.split(".")))
    return f"{reversed_group}.{rt.version}.{rt.kind}"


def _cr_schema(rt: ResourceType) -> dict[str, Any]:
    schema = copy.deepcopy(rt.schema or {"type": "object", "x-kubernetes-preserve-unknown-fields": True})
    props = schema.setdefault("properties", {})
    props["metadata"] = {"allOf": [{"$ref": _REF_PREFIX + _OBJECT_META}], "description": "Standard object's metadata."}
    props.setdefault("apiVersion", {"type": "string", "description": "APIVersion defines the versioned schema of this representation of an object."})
    props.setdefault("kind", {"type": "string", "description": "Kind is a string value representing the REST resource this object represents."})
    schema["type"] = "object"
    schema["x-kubernetes-group-version-kind"] = [{"group": rt.group, "version": rt.version, "kind": rt.kind}]
    return schema


def _operation(rt: ResourceType, verb: str, with_validation: bool) -> dict[str, Any]:
    op: dict[str, Any] = {
        "operationId": f"{verb}{rt.kind}",
        "x-kubernetes-action": verb,
        "x-kubernetes-group-version-kind": {"group": rt.group, "version": rt.version, "kind": rt.kind},
        "responses": {"200": {"description": "OK", "content": {"application/json": {"schema": {"$ref": _REF_PREFIX + _schema_name(rt)}}}}},
    }
    params = [{"name": "dryRun", "in": "query", "schema": {"type": "string", "uniqueItems": True}},
              {"name": "fieldManager", "in": "query", "schema": {"type": "string", "uniqueItems": True}}]
    if with_validation:
        params.append({"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": True},
                       "description": "fieldValidation instructs the server on how to handle objects in the request "
                                      "containing unknown or duplicate fields."})
    if verb == "patch":
        params.append({"name": "force", "in": "query", "schema": {"type": "boolean", "uniqueItems": True}})
        # kubectl's client-side apply sends a strategic merge patch only when the PATCH operation
        # lists that media type: custom resources must not (the server answers 415 for them).
        media = ["application/apply-patch+yaml", "application/json-patch+json", "application/merge-patch+json"]
        if rt.builtin:
            media.append("application/strategic-merge-patch+json")
        op["requestBody"] = {"content": {t: {"schema": {"type": "object"}} for t in media}}
    op["parameters"] = params
    return op


def _schema_name(rt: ResourceType) -> str:
    return rt.definition if rt.builtin and rt.definition else _cr_schema_name(rt)


def group_version_document(registry: Registry, group: str, version: str) -> dict[str, Any] | None:
    types = [t for t in registry.all() if t.group == group and t.version == version]
    if not types:
        return None
    schemas: dict[str, Any] = {}
    builtin_names = [t.definition for t in types if t.builtin and t.definition]
    builtin_names.append(_OBJECT_META)
    for name, body in _closure(builtin_names).items():
        schemas[name] = _convert(body)
    paths: dict[str, Any] = {}
    prefix = f"/apis/{group}/{version}" if group else f"/api/{version}"
    for rt in types:
        if not rt.builtin:
            schemas[_cr_schema_name(rt)] = _cr_schema(rt)
        elif rt.definition and rt.definition in schemas:
            schemas[rt.definition].setdefault(
                "x-kubernetes-group-version-kind", [{"group": rt.group, "version": rt.version, "kind": rt.kind}])
        elif rt.definition:
            schemas[rt.definition] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
                                      "x-kubernetes-group-version-kind": [{"group": rt.group, "version": rt.version, "kind": rt.kind}]}
        collection = f"{prefix}/namespaces/{{namespace}}/{rt.resource}" if rt.namespaced else f"{prefix}/{rt.resource}"
        paths[collection] = {"get": _operation(rt, "list", False), "post": _operation(rt, "post", True)}
        paths[collection + "/{name}"] = {"get": _operation(rt, "get", False), "put": _operation(rt, "put", True),
                                         "patch": _operation(rt, "patch", True), "delete": _operation(rt, "delete", False)}
        if rt.has_status:
            paths[collection + "/{name}/status"] = {"get": _operation(rt, "get", False), "put": _operation(rt, "put", True),
                                                    "patch": _operation(rt, "patch", True)}
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.36.0"}, "paths": paths,
            "components": {"schemas": schemas}}


class OpenApiCache:
    """Documents rendered on first use and cached by a fingerprint of the group-version's types.

    The fingerprint is the URL hash, so it changes whenever a CRD's schema or names change
    (kubectl caches these documents by URL).
    """

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self._docs: dict[str, bytes] = {}  # fingerprint -> document

    def _fingerprints(self) -> dict[str, tuple[str, str, str]]:
        out: dict[str, tuple[str, str, str]] = {}
        by_gv: dict[tuple[str, str], list[ResourceType]] = {}
        for t in self.registry.all():
            by_gv.setdefault((t.group, t.version), []).append(t)
        for (group, version), types in by_gv.items():
            key = f"apis/{group}/{version}" if group else f"api/{version}"
            material = json.dumps([[t.resource, t.kind, t.namespaced, sorted(t.subresources), t.schema]
                                   for t in sorted(types, key=lambda t: t.resource)], sort_keys=True, default=str)
            out[key] = (hashlib.sha512(material.encode()).hexdigest()[:64].upper(), group, version)
        return out

    def index(self) -> dict[str, Any]:
        return {"paths": {key: {"serverRelativeURL": f"/openapi/v3/{key}?hash={h}"}
                          for key, (h, _, _) in sorted(self._fingerprints().items())}}

    def document(self, key: str) -> bytes | None:
        entry = self._fingerprints().get(key)
        if entry is None:
            return None
        fingerprint, group, version = entry
        raw = self._docs.get(fingerprint)
        if raw is None:
            doc = group_version_document(self.registry, group, version)
            if doc is None:
                return None
            raw = json.dumps(doc, separators=(",", ":")).encode()
            if len(self._docs) > 64:
                self._docs.clear()
            self._docs[fingerprint] = raw
        return raw
