"""A thin async Kubernetes REST client on aiohttp, reaching the cluster its kubeconfig names
(address, TLS and credentials from :mod:`trainyard.kube.connection`).

The services handle several API groups generically (TrainJob, JobSet, PodGroups, Secrets...),
so this talks JSON to REST paths instead of using generated typed APIs.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
from typing import Any, AsyncIterator

import aiohttp
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from trainyard.kube.connection import Connection
from trainyard.kube.resources import Resource, resource_for
from trainyard.telemetry import detail

log = logging.getLogger(__name__)
_tracer = trace.get_tracer("trainyard.kube")


def _span(name: str, resource: Resource, namespace: str | None, obj_name: str | None):
    """A CLIENT span around one write to the API server."""
    return detail.span(_tracer.start_as_current_span, name, kind=SpanKind.CLIENT, attributes={
        "k8s.kind": resource.kind, "k8s.namespace.name": namespace or "", "k8s.object.name": obj_name or "",
    })

FIELD_MANAGER = "trainer"


class KubeError(Exception):
    """An API error with its HTTP status, Kubernetes reason and message."""

    def __init__(self, status: int, reason: str, message: str, body: dict | None = None) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.body = body or {}

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409

    @property
    def unavailable(self) -> bool:
        """The server did not answer, or said it cannot now (connection refused, timeout,
        throttled, 502/503/504): the same request later may succeed."""
        return self.status in (0, 429, 502, 503, 504)

    @property
    def transient(self) -> bool:
        """Worth retrying: throttled, server-side trouble, timeouts, optimistic conflicts."""
        return self.status in (0, 408, 409, 429) or self.status >= 500


# Connections open to one API server at once (kubernetes-asyncio's default, which the services
# had before). Each watch holds one for as long as it streams: the devcluster's data plane alone
# keeps a dozen open, and requests beyond the limit queue for a free connection.
MAX_CONNECTIONS = 100
# A watch event can carry a whole large object (etcd allows 1.5 MiB requests).
READ_BUFFER_BYTES = 2 ** 21


class KubeClient:
    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self._host = connection.server.rstrip("/")
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=MAX_CONNECTIONS, ssl=connection.ssl_context),
            trust_env=_proxy_configured(), read_bufsize=READ_BUFFER_BYTES,
        )

    @classmethod
    async def from_kubeconfig(cls, path: str | None, context: str | None = None) -> "KubeClient":
        """The cluster kubectl would pick (trainyard.kube.kubeconfig): ``path``, else
        $TRAINYARD_KUBECONFIG, $KUBECONFIG (merged), ~/.kube/config, in-cluster; ``context``
        overrides the current context."""
        from trainyard.kube.kubeconfig import resolve

        return await cls.from_resolved(resolve(path, context))

    @classmethod
    async def from_resolved(cls, resolved: Any) -> "KubeClient":
        from trainyard.kube.connection import connection_for

        return cls(await connection_for(resolved))

    @classmethod
    async def from_kubeconfig_dict(cls, kubeconfig: dict, *, context: str | None = None) -> "KubeClient":
        """From a kubeconfig held in memory (e.g. read from a Secret): it never touches disk."""
        from trainyard.kube.kubeconfig import resolve_document

        return await cls.from_resolved(resolve_document(kubeconfig, context))

    async def close(self) -> None:
        await self._session.close()

    async def _send(self, method: str, path: str, *, query: dict[str, Any] | None, headers: dict[str, str],
                    body: Any, timeout: aiohttp.ClientTimeout) -> aiohttp.ClientResponse:
        headers = {**headers, **await self._connection.credential.headers()}
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body))
        try:
            return await self._session.request(
                method, self._host + path, params=_clean(query), headers=headers, data=data,
                timeout=timeout, server_hostname=self._connection.tls_server_name,
                proxy=self._connection.proxy,
            )
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as err:
            raise KubeError(0, "ConnectionError", str(err) or type(err).__name__) from err

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout_s: float = 30.0,
    ) -> dict[str, Any]:
        """One API call; a non-2xx answer raises :class:`KubeError`."""
        response = await self._send(method, path, query=query, body=body,
                                    headers={"Accept": "application/json", "Content-Type": content_type},
                                    timeout=aiohttp.ClientTimeout(total=timeout_s))
        async with response:
            try:
                raw = await response.read()
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as err:
                raise KubeError(0, "ConnectionError", str(err) or type(err).__name__) from err
            return _decode(response.status, raw)

    async def pod_log(self, namespace: str, name: str, *, container: str | None = None,
                      tail_lines: int = 20, timeout_s: float = 10.0) -> str:
        """The last ``tail_lines`` lines of a pod's (container's) log, as text."""
        response = await self._send(
            "GET", f"/api/v1/namespaces/{namespace}/pods/{name}/log",
            query={"tailLines": str(tail_lines), "container": container}, body=None,
            headers={"Accept": "text/plain, */*"}, timeout=aiohttp.ClientTimeout(total=timeout_s))
        async with response:
            try:
                raw = await response.read()
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as err:
                raise KubeError(0, "ConnectionError", str(err) or type(err).__name__) from err
            if not 200 <= response.status <= 299:
                _decode(response.status, raw)
            return raw.decode("utf-8", "replace")

    async def ping(self) -> bool:
        try:
            await self.request("GET", "/version", timeout_s=5.0)
            return True
        except KubeError:
            return False

    async def get(self, resource: Resource, namespace: str | None, name: str, *,
                  timeout_s: float = 30.0) -> dict | None:
        try:
            return await self.request("GET", resource.path(namespace, name), timeout_s=timeout_s)
        except KubeError as err:
            if err.not_found:
                return None
            raise

    async def list(
        self, resource: Resource, namespace: str | None = None, *, label_selector: str | None = None
    ) -> tuple[list[dict], str]:
        """All items (following ``continue`` pages) and the list's resourceVersion."""
        items: list[dict] = []
        resource_version = ""
        async for page, resource_version in self.list_pages(resource, namespace, label_selector=label_selector):
            items.extend(page)
        return items, resource_version

    async def list_pages(
        self, resource: Resource, namespace: str | None = None, *, label_selector: str | None = None,
        limit: int = 500,
    ) -> AsyncIterator[tuple[list[dict], str]]:
        """The list page by page (``limit`` items each, following ``continue``), each with the
        list's resourceVersion: a caller that handles a page at a time never holds them all."""
        token: str | None = None
        while True:
            body = await self.request(
                "GET", resource.path(namespace),
                query={"labelSelector": label_selector, "limit": limit, "continue": token},
            )
            items = body.get("items") or []
            for item in items:
                item.setdefault("apiVersion", resource.api_version)
                item.setdefault("kind", resource.kind)
            token = (body.get("metadata") or {}).get("continue")
            yield items, str((body.get("metadata") or {}).get("resourceVersion", ""))
            if not token:
                return

    async def watch(
        self, resource: Resource, resource_version: str, *, timeout_s: int = 300,
        label_selector: str | None = None,
    ) -> AsyncIterator[dict]:
        """Streams watch events (``{"type", "object"}``) from ``resource_version``, with
        bookmarks. Ends when the server closes the stream."""
        query = {
            "watch": "true", "resourceVersion": resource_version, "allowWatchBookmarks": "true",
            "timeoutSeconds": timeout_s, "labelSelector": label_selector,
        }
        response = await self._send(
            "GET", resource.path(), query=query, body=None, headers={"Accept": "application/json"},
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=timeout_s + 30),
        )
        async with response:
            if response.status != 200:
                _decode(response.status, await response.read())
            buffer = b""
            try:
                async for chunk in response.content.iter_any():
                    buffer += chunk
                    while b"\n" in buffer:
                        line, buffer = buffer.split(b"\n", 1)
                        if line.strip():
                            yield json.loads(line)
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as err:
                raise KubeError(0, "ConnectionError", str(err) or type(err).__name__) from err
            if buffer.strip():
                yield json.loads(buffer)

    async def apply(self, obj: dict, *, field_manager: str = FIELD_MANAGER, force: bool = True,
                    timeout_s: float = 30.0) -> dict:
        """Server-side apply of a complete object (field manager ``trainer``, forced)."""
        meta = obj.get("metadata") or {}
        resource = resource_for(obj.get("apiVersion", ""), obj.get("kind", ""))
        with _span(f"SSA {resource.kind}", resource, meta.get("namespace"), meta.get("name")):
            return await self.request(
                "PATCH", resource.path(meta.get("namespace"), meta.get("name")),
                query={"fieldManager": field_manager, "force": "true" if force else None},
                body=obj, content_type="application/apply-patch+yaml", timeout_s=timeout_s,
            )

    async def delete(self, resource: Resource, namespace: str | None, name: str,
                     *, uid: str | None = None, timeout_s: float = 30.0) -> bool:
        """Deletes (background propagation); False when already gone."""
        body: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1",
                                "propagationPolicy": "Background"}
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            with _span(f"DELETE {resource.kind}", resource, namespace, name):
                await self.request("DELETE", resource.path(namespace, name), body=body, timeout_s=timeout_s)
            return True
        except KubeError as err:
            if err.not_found:
                return False
            raise

    async def replace_status(self, resource: Resource, obj: dict) -> dict:
        """PUT of the status subresource (optimistic concurrency on resourceVersion)."""
        meta = obj["metadata"]
        with _span(f"status write {resource.kind}", resource, meta.get("namespace"), meta["name"]):
            return await self.request("PUT", resource.path(meta.get("namespace"), meta["name"], "status"),
                                      body=obj)

    async def merge_patch(self, resource: Resource, namespace: str | None, name: str,
                          patch: dict) -> dict:
        return await self.request("PATCH", resource.path(namespace, name), body=patch,
                                  content_type="application/merge-patch+json")

    async def create(self, resource: Resource, namespace: str | None, obj: dict) -> dict:
        return await self.request("POST", resource.path(namespace), body=obj)


_PROXY_VARIABLES = ("https_proxy", "http_proxy", "all_proxy", "ws_proxy", "wss_proxy")


def _proxy_configured() -> bool:
    """Whether the session should read the environment: with it, aiohttp looks up ~/.netrc and
    the proxy variables on every request, each in a worker thread (two thread hops and a file
    read per API call, most of a small request's client CPU). A kubeconfig carries its own
    credentials, so .netrc never applies; the proxy variables only matter when one is set."""
    return any(os.environ.get(name) or os.environ.get(name.upper()) for name in _PROXY_VARIABLES)


def _clean(query: dict[str, Any] | None) -> dict[str, str]:
    return {k: str(v) for k, v in (query or {}).items() if v not in (None, "")}


def _decode(status: int, raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw) if raw else {}
    except ValueError:
        body = {"message": raw.decode("utf-8", "replace")[:500]}
    if 200 <= status <= 299:
        return body
    if not isinstance(body, dict):
        body = {"message": str(body)}
    raise KubeError(status, str(body.get("reason", "")), str(body.get("message", "")), body)
