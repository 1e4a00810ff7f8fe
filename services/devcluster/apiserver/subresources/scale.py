"""The ``scale`` subresource of custom resources: ``autoscaling/v1`` ``Scale``, as kube-apiserver serves it.

A CRD version that declares ``subresources.scale`` (``specReplicasPath``, ``statusReplicasPath``,
optional ``labelSelectorPath``) gets ``.../<resource>/<name>/scale``: GET answers a Scale built
from the object (``spec.replicas`` from the spec path, ``status.replicas`` from the status path,
0 when absent, ``status.selector`` from the selector path, metadata name/namespace/uid/
resourceVersion/creationTimestamp of the object); PUT and PATCH (merge, JSON, strategic, which
for a Scale is a merge, and apply) change the object at the spec path only. The write is an
update of the object with subresource ``scale``: schema, CEL rules and the scale path checks
apply, and admission webhooks that match ``<resource>/scale`` see Scale objects.

The Scale view itself is pure and lives in registry/scale_view.py; ``ScaleEndpoint`` does the requests.
"""
from __future__ import annotations

import copy
from typing import Any, Callable

from .. import errors
from ..registry import machinery
from ..registry.kinds import ResourceType
from ..registry.options import WriteOptions
from ..registry.scale_view import (MAX_INT32, SCALE_API_VERSION, SCALE_KIND, UNSET_REPLICAS, ScaleType,
                                   parent_managed_fields, scale_managed_fields, scale_or_400, with_replicas)


def decode_scale(body: Any, opts: WriteOptions) -> dict[str, Any]:
    """A Scale request body checked as kube-apiserver decodes one: object, kind and version,
    unknown fields per ``fieldValidation``, ``spec.replicas`` an int32."""
    if not isinstance(body, dict):
        raise errors.bad_request("the body of a Scale must be a JSON object")
    kind, api_version = body.get("kind") or SCALE_KIND, body.get("apiVersion") or SCALE_API_VERSION
    if kind != SCALE_KIND or api_version != SCALE_API_VERSION:
        raise errors.bad_request(f"the kind in the data ({kind}, {api_version}) does not match the expected kind "
                                 f"({SCALE_KIND}, {SCALE_API_VERSION}) for the scale subresource")
    body = dict(body, kind=SCALE_KIND, apiVersion=SCALE_API_VERSION)
    if not isinstance(body.get("metadata", {}), dict) or not isinstance(body.get("spec", {}), dict):
        raise errors.bad_request("Scale in version \"v1\" cannot be handled as a Scale: metadata and spec must be objects")
    body = machinery.check_builtin_fields(ScaleType(), body, opts)  # type: ignore[arg-type]
    replicas = (body.get("spec") or {}).get("replicas")
    if replicas is not None and (isinstance(replicas, bool) or not isinstance(replicas, int)):
        shown = {str: "string", bool: "bool", dict: "object", list: "array"}.get(type(replicas), f"number {replicas}")
        raise errors.bad_request("Scale in version \"v1\" cannot be handled as a Scale: json: cannot unmarshal "
                                 f"{shown} into Go struct field ScaleSpec.spec.replicas of type int32")
    if replicas is not None and not -(2**31) <= replicas <= MAX_INT32:
        raise errors.bad_request("Scale in version \"v1\" cannot be handled as a Scale: json: cannot unmarshal "
                                 f"number {replicas} into Go struct field ScaleSpec.spec.replicas of type int32")
    return body


def _check_identity(rt: ResourceType, namespace: str | None, name: str, meta: dict[str, Any]) -> None:
    if meta.get("name") and meta["name"] != name:
        raise errors.bad_request(f"the name of the object ({meta['name']}) does not match the name on the URL ({name})")
    if rt.namespaced and meta.get("namespace") and meta["namespace"] != namespace:
        raise errors.bad_request("the namespace of the provided object does not match the namespace sent on the request")


class ScaleEndpoint:
    """GET/PUT/PATCH of ``<resource>/<name>/scale`` over the ``Api``."""

    def __init__(self, api: Any) -> None:
        self.api = api

    def get(self, rt: ResourceType, namespace: str | None, name: str) -> dict[str, Any]:
        obj = self.api.get(rt, namespace, name)
        return scale_or_400(obj, rt.scale or {})[0]

    async def update(self, rt: ResourceType, namespace: str | None, name: str, body: Any, opts: WriteOptions) -> dict[str, Any]:
        return await self._write(rt, namespace, name, opts, lambda _old: decode_scale(body, opts))

    async def patch(self, rt: ResourceType, namespace: str | None, name: str, patch_type: str, body: bytes,
                    opts: WriteOptions) -> dict[str, Any]:
        if patch_type == "apply":
            return await self._apply(rt, namespace, name, body, opts)

        def patched(old_scale: dict[str, Any]) -> dict[str, Any]:
            # A Scale has no lists: a strategic merge patch of it is a JSON merge patch.
            kind = "merge" if patch_type == "strategic" else patch_type
            return decode_scale(machinery.apply_patch(rt, kind, old_scale, body), opts)
        return await self._write(rt, namespace, name, opts, patched)

    async def _apply(self, rt: ResourceType, namespace: str | None, name: str, body: bytes,
                     opts: WriteOptions) -> dict[str, Any]:
        """Server-Side Apply of a Scale: the object's managers of the spec replicas path become
        the Scale's managers of ``spec.replicas``, the apply runs on the Scale (conflicts,
        ``force``), and the resulting ownership goes back to the object."""
        config = rt.scale or {}
        applied = decode_scale(machinery.parse_apply_body(body), opts)
        old = self.api.stored(rt, namespace, name).load()
        live, found = scale_or_400(old, config)
        if not found:
            live["spec"]["replicas"] = UNSET_REPLICAS
        live["metadata"]["managedFields"] = scale_managed_fields(old["metadata"].get("managedFields") or [], config)
        meta = applied.get("metadata") or {}
        _check_identity(rt, namespace, name, meta)
        rv = meta.get("resourceVersion")
        if rv and rv != old["metadata"].get("resourceVersion"):
            raise errors.conflict(rt.qualified_resource, name, rt.group, rt.resource)
        result = machinery.server_side_apply(ScaleType(), live, applied, opts).object  # type: ignore[arg-type]
        replicas = (result.get("spec") or {}).get("replicas") or 0
        if replicas == UNSET_REPLICAS:
            raise errors.bad_request(f'the spec replicas field "{config.get("specReplicasPath")}" cannot be empty')
        new = with_replicas(old, config, replicas)
        new["metadata"]["managedFields"] = parent_managed_fields(
            old["metadata"].get("managedFields") or [], (result.get("metadata") or {}).get("managedFields") or [],
            config, rt.api_version)
        if not new["metadata"]["managedFields"]:
            new["metadata"].pop("managedFields")
        updated = await self.api.update_from(rt, old, new, opts, managed_fields_done=True)
        return scale_or_400(updated, config)[0]

    async def _write(self, rt: ResourceType, namespace: str | None, name: str, opts: WriteOptions, make: Callable[[dict[str, Any]], dict[str, Any]]) -> dict[str, Any]:
        config = rt.scale or {}
        old = self.api.stored(rt, namespace, name).load()
        old_scale, found = scale_or_400(old, config)
        if not found:
            old_scale["spec"]["replicas"] = UNSET_REPLICAS
        new_scale = make(copy.deepcopy(old_scale))
        meta = new_scale.get("metadata") or {}
        _check_identity(rt, namespace, name, meta)
        replicas = (new_scale.get("spec") or {}).get("replicas") or 0
        if replicas == UNSET_REPLICAS:
            raise errors.bad_request(f'the spec replicas field "{config.get("specReplicasPath")}" cannot be empty')
        rv = meta.get("resourceVersion")
        if rv and rv != old["metadata"].get("resourceVersion"):
            raise errors.conflict(rt.qualified_resource, name, rt.group, rt.resource)
        updated = await self.api.update_from(rt, old, with_replicas(old, config, replicas), opts)
        return scale_or_400(updated, config)[0]
