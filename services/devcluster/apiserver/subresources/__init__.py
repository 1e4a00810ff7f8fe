"""Subresources with their own REST handler, registered by name: log, token, binding, scale.

The registry (``registry/kinds.py``) says which kinds have which subresource (pods: status, log,
binding; serviceaccounts: token; a custom resource: what its CRD declares); the server refuses
any other before routing. ``status`` (and a namespace's ``finalize``) are the generic store's
update and patch with the subresource's strategy (``WriteOptions.subresource``), as
kube-apiserver's StatusREST is the same store; the others are handlers here, each given the
request, its kind, namespace and name.
"""
from __future__ import annotations

from typing import Awaitable, Callable

from aiohttp import web

from .. import codec, errors
from ..registry import machinery
from ..registry.clock import now_rfc3339
from .logs import PodLogs
from ..registry.kinds import Registry, ResourceType
from ..registry.store import Api
from .scale import ScaleEndpoint
from .tokens import TokenRequests
from ..registry.guaranteed import guaranteed_update
from ..registry.options import WriteOptions

Handler = Callable[[web.Request, ResourceType, str | None, str, dict[str, str]], Awaitable[web.StreamResponse]]
STATUS_SUCCESS = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}


def _only(method: str, request: web.Request, rt: ResourceType) -> None:
    if request.method != method:
        raise errors.method_not_allowed(request.method, rt.qualified_resource, rt.group, rt.resource)


class Subresources:
    """The handlers by subresource name."""

    def __init__(self, api: Api, registry: Registry, logs: PodLogs, tokens: TokenRequests) -> None:
        self.api = api
        self.registry = registry
        self.logs = logs
        self.tokens = tokens
        self._handlers: dict[str, Handler] = {"log": self.log, "token": self.token, "binding": self.binding,
                                              "scale": self.scale}

    def handler(self, subresource: str | None, name: str | None) -> Handler | None:
        """The handler of ``<resource>/<name>/<subresource>``; None: the generic store serves it."""
        if not subresource or name is None:
            return None
        return self._handlers.get(subresource)

    async def log(self, request: web.Request, rt: ResourceType, ns: str | None, name: str,
                  query: dict[str, str]) -> web.StreamResponse:
        """``pods/log``: a container's output (``podlogs.py``)."""
        _only("GET", request, rt)
        return await self.logs.serve(request, self.api, rt, ns or "default", name, query)

    async def token(self, request: web.Request, rt: ResourceType, ns: str | None, name: str,
                    query: dict[str, str]) -> web.StreamResponse:
        """``serviceaccounts/token``: a TokenRequest (``tokens.py``)."""
        _only("POST", request, rt)
        body = await codec.decode_object(request)
        return codec.json_response(self.tokens.token_request(self.api, self.registry, ns or "default", name, body), 201)

    async def binding(self, request: web.Request, rt: ResourceType, ns: str | None, name: str,
                      query: dict[str, str]) -> web.StreamResponse:
        """``pods/binding``: the scheduler's assignment of a pod to a node: ``spec.nodeName``
        (409 when already assigned), then the ``PodScheduled`` condition in the status."""
        _only("POST", request, rt)
        body = await codec.decode_object(request)
        opts = codec.write_options(request, query, None)
        namespace = ns or "default"
        if not isinstance(body, dict) or not isinstance(body.get("target"), dict) or not body["target"].get("name"):
            raise errors.bad_request("a Binding needs target.name (the node)")
        opts.manager = opts.manager or "default-scheduler"
        node = body["target"]["name"]
        key = (rt.storage_key, namespace, name)

        async def assign() -> None:
            # read, check and write again when another write (a kubelet's status) commits first
            pod = self.api.get(rt, namespace, name)
            current = (pod.get("spec") or {}).get("nodeName")
            if current:
                raise errors.conflict(rt.qualified_resource, name, rt.group, rt.resource,
                                      f"pod {name} is already assigned to node \"{current}\"")
            pod["spec"]["nodeName"] = node
            await self.api.update(rt, namespace, name, pod, opts)

        async def scheduled() -> None:
            pod = self.api.get(rt, namespace, name)
            conditions = [c for c in (pod.get("status") or {}).get("conditions") or []
                          if c.get("type") != "PodScheduled"]
            conditions.append({"type": "PodScheduled", "status": "True", "lastProbeTime": None,
                               "lastTransitionTime": now_rfc3339()})
            pod.setdefault("status", {})["conditions"] = conditions
            await self.api.update(rt, namespace, name, pod, WriteOptions(manager=opts.manager, subresource="status"))

        await guaranteed_update(key, assign, opts)
        await guaranteed_update(key, scheduled)
        return codec.json_response({**STATUS_SUCCESS, "code": 201}, 201)

    async def scale(self, request: web.Request, rt: ResourceType, ns: str | None, name: str,
                    query: dict[str, str]) -> web.StreamResponse:
        """``<resource>/<name>/scale`` of a custom resource (``scale.py``)."""
        endpoint = ScaleEndpoint(self.api)
        if rt.namespaced and ns is None:
            raise errors.not_found_path()
        if request.method == "GET":
            return codec.json_response(endpoint.get(rt, ns, name))
        if request.method not in ("PUT", "PATCH"):
            raise errors.method_not_allowed(request.method, rt.qualified_resource, rt.group, rt.resource)
        opts = codec.write_options(request, query, "scale")
        if request.method == "PUT":
            body = await codec.decode_object(request)
            scale = await guaranteed_update((rt.storage_key, ns or "", name),
                                            lambda: endpoint.update(rt, ns, name, body, opts), opts)
            return codec.json_response(scale, warnings=opts.warnings)
        patch_type = codec.patch_type(request)
        if patch_type is None:
            raise errors.unsupported_media_type(machinery.BUILTIN_PATCH_TYPES)
        if patch_type == "apply" and not opts.manager_given:
            raise errors.bad_request('PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: '
                                     "is required for apply patch")
        body = await codec.read_body(request)
        scale = await guaranteed_update((rt.storage_key, ns or "", name),
                                        lambda: endpoint.patch(rt, ns, name, patch_type, body, opts), opts)
        return codec.json_response(scale, warnings=opts.warnings)
