"""The HTTP(S) layer of the devcluster API server (aiohttp): routing, auth, encoding, streaming.

``serve(...)`` runs the server until cancelled and can run beside other tasks (the data plane).
"""
from __future__ import annotations

import asyncio
import json
import logging
import ssl
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Awaitable, Callable
from urllib.parse import parse_qsl, unquote

from aiohttp import web

from trainyard.apimachinery import rbac

from trainyard import eventloop

from .endpoints import discovery
from . import errors
from .registry import machinery
from .subresources import logs as podlogs
from .endpoints import tables, watch
from .filters.authentication import ADMIN, Authenticator, ensure_controllers_token
from .admission.policies import ValidatingPolicies
from .filters.audit import AUTHENTICATED_USER as AUDIT_USER, AuditLog
from .admission.stage import Admission
from .subresources import Subresources
from .filters.authorization import Authorization
from .errors import ApiError
from .endpoints.openapi import OpenApiCache
from .registry.kinds import Registry, ResourceType
from .registry.store import Api, WriteOptions
from .registry.options import AUDIT_ANNOTATIONS
from .codec import JSON, MAX_BODY, PATCH_TYPES, decode_object, json_response, read_body, write_options
from .query import parse_bool
from ..storage.datadir import PODS_NAME
from ..storage.store import Store, dumps
from ..tls import Credentials, ensure_credentials
from .serviceaccount_issuer import ServiceAccountIssuer
from .subresources.tokens import TokenRequests
from .admission.webhooks import Webhooks
from .endpoints import metrics as devcluster_metrics

log = logging.getLogger("trainyard.devcluster.server")

KUBERNETES_VERSION = {"major": "1", "minor": "36", "emulationMajor": "1", "emulationMinor": "36",
                      "gitVersion": "v1.36.0", "gitCommit": "trainyard-devcluster", "gitTreeState": "clean",
                      "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.25.0", "compiler": "gc",
                      "platform": "linux/amd64"}
@dataclass
class Target:
    group: str
    version: str
    namespace: str | None
    resource: str
    name: str | None
    subresource: str | None


def parse_resource_path(segments: list[str]) -> Target | None:
    """``api/v1/...`` or ``apis/g/v/...`` (segments without empty parts) -> the addressed target."""
    if segments[0] == "api":
        if len(segments) < 3:
            return None
        group, version, rest = "", segments[1], segments[2:]
    else:
        if len(segments) < 4:
            return None
        group, version, rest = segments[1], segments[2], segments[3:]
    namespace = None
    if group == "" and rest[0] == "namespaces" and len(rest) == 3 and rest[2] in ("status", "finalize"):
        # /api/v1/namespaces/{name}/status|finalize: subresources of the Namespace itself
        return Target(group, version, None, "namespaces", rest[1], rest[2])
    if rest[0] == "namespaces" and len(rest) >= 3:
        namespace, rest = rest[1], rest[2:]
    elif rest[0] == "namespaces" and group == "":
        # /api/v1/namespaces/{name}: the Namespace object itself
        return Target(group, version, None, "namespaces", rest[1] if len(rest) > 1 else None, None)
    if len(rest) > 3:
        return None
    return Target(group, version, namespace, rest[0], rest[1] if len(rest) > 1 else None, rest[2] if len(rest) > 2 else None)


class ApiServer:
    def __init__(self, data_dir: Path, credentials: Credentials | None, history_size: int = 4096,
                 require_auth: bool = True, authorization_mode: str = "RBAC", store: Store | None = None) -> None:
        """``store``: an API worker's replica (``storage.replica``); by default this process's own store."""
        self.data_dir = data_dir
        self.store = store if store is not None else Store(data_dir, history_size=history_size)
        self.registry = Registry()
        self.api = Api(self.store, self.registry,
                       Admission(Webhooks(self.store), ValidatingPolicies(self.store, self.registry)))
        self.openapi = OpenApiCache(self.registry)
        self.credentials = credentials
        self.require_auth = require_auth and credentials is not None
        self.address = "127.0.0.1:0"
        self._stopping = asyncio.Event()
        self.logs = podlogs.PodLogs(data_dir / PODS_NAME)
        self.tokens = ServiceAccountIssuer(data_dir)
        # Who a request is (filters/authentication.py) and what it may do (filters/authorization.py: RBAC, impersonation, reviews).
        self.authn = Authenticator(credentials.token if credentials is not None else "",
                                   ensure_controllers_token(data_dir), self.tokens, self.api, self.registry)
        self.authz = Authorization(self.api, self.registry, authorization_mode)
        devcluster_metrics.register_store(self.store)
        # log, token, binding, scale (apiserver/subresources/); status is the generic store's
        self.subresources = Subresources(self.api, self.registry, self.logs, TokenRequests(self.tokens))
        self.audit: AuditLog | None = None  # --audit-log-path (audit.py)

    # ---------------------------------------------------------------- app

    def make_app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY + 1024)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    async def start(self) -> None:
        self.store.start(asyncio.get_running_loop())
        await self.api.bootstrap()
        await self.authz.bootstrap()
        self.api.chain.rbac_guard = self.authz.guard_rbac_write

    async def stop_watches(self) -> None:
        """Wake every watch so it ends its stream before the HTTP server shuts down."""
        self._stopping.set()
        self.store.wake_all()

    async def stop(self) -> None:
        self._stopping.set()
        await self.store.close()
        if self.audit is not None:
            self.audit.close()

    # ---------------------------------------------------------------- dispatch

    async def handle(self, request: web.Request) -> web.StreamResponse:
        started = time.monotonic()
        received = datetime.now(timezone.utc) if self.audit is not None else None
        labels = _request_labels(request)
        verb = labels[0]
        kind = devcluster_metrics.request_kind(verb)
        devcluster_metrics.INFLIGHT.labels(kind).inc()
        longrunning = devcluster_metrics.LONGRUNNING.labels(*labels[:3]) if verb == "WATCH" else None
        if longrunning is not None:
            longrunning.inc()
        response = None
        try:
            response = await self._measured_dispatch(request)
        finally:
            devcluster_metrics.INFLIGHT.labels(kind).dec()
            if longrunning is not None:
                longrunning.dec()
            code = str(response.status) if response is not None else "499"
            devcluster_metrics.REQUESTS.labels(*labels, code).inc()
            if verb != "WATCH":
                devcluster_metrics.REQUEST_DURATION.labels(*labels).observe(time.monotonic() - started)
            if received is not None:
                self._audit(request, response.status if response is not None else 499, received)
        return response

    def _audit(self, request: web.Request, code: int, received: datetime) -> None:
        """One audit event for an authenticated request (audit.py)."""
        authenticated = request.get(AUDIT_USER)
        if self.audit is None or authenticated is None:
            return
        user = request.get("user") or authenticated
        query = dict(parse_qsl(request.rel_url.raw_query_string, keep_blank_values=True))
        info = rbac.request_info(user, request.method, unquote(request.rel_url.raw_path), query)
        self.audit.write(self.audit.event(user, authenticated, info, request.rel_url.raw_path_qs, request.remote or "",
                                          request.headers.get("User-Agent", ""), code, received,
                                          request.get(AUDIT_ANNOTATIONS) or {}))

    async def _measured_dispatch(self, request: web.Request) -> web.StreamResponse:
        started = time.monotonic()
        try:
            response = await self._dispatch(request)
        except ApiError as err:
            response = self._status_response(err)
        except asyncio.CancelledError:
            raise
        except (ConnectionResetError, ConnectionError):
            raise
        except RecursionError:
            response = self._status_response(errors.bad_request("the request body is nested too deeply"))
        except Exception as err:  # noqa: BLE001 - every failure becomes a Status, never a dropped connection
            log.exception("internal error on %s %s", request.method, request.path)
            response = self._status_response(errors.internal(str(err)))
        if log.isEnabledFor(logging.DEBUG):
            log.debug(json.dumps({"method": request.method, "path": request.path_qs, "status": response.status,
                                  "ms": round((time.monotonic() - started) * 1000, 2)}))
        return response

    def _status_response(self, err: ApiError) -> web.Response:
        return web.Response(body=dumps(err.status()), status=err.code, content_type=JSON)

    def _written_body(self, rt: ResourceType, obj: dict[str, Any], opts: WriteOptions) -> dict[str, Any] | bytes:
        """The JSON the store encoded for a custom resource just written (or left unchanged), so
        the answer does not encode the same object a second time. A resourceVersion names one
        stored state; dry runs are never stored, and built-in kinds may be adjusted after
        storing (CRDs), so those are encoded from ``obj``."""
        if rt.builtin or opts.dry_run or not isinstance(obj, dict) or obj.get("kind") != rt.kind:
            return obj
        meta = obj.get("metadata") or {}
        stored = self.api.store.get(rt.storage_key, meta.get("namespace", "") if rt.namespaced else "",
                                    meta.get("name", ""))
        if stored is not None and meta.get("resourceVersion") == str(stored.rv):
            return stored.raw
        return obj

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        raw_path = request.rel_url.raw_path
        segments = [unquote(s) for s in raw_path.split("/") if s]
        query = dict(parse_qsl(request.rel_url.raw_query_string, keep_blank_values=True))
        method = request.method
        if segments and segments[0] in ("healthz", "readyz", "livez"):
            return web.Response(text="ok", content_type="text/plain")
        if segments == ["version"]:
            return json_response(KUBERNETES_VERSION)
        # Service account issuer discovery: public keys, served without credentials so that
        # relying parties (the trainer status endpoint) need none.
        if segments == [".well-known", "openid-configuration"] and method == "GET":
            return json_response(self.tokens.discovery())
        if segments == ["openid", "v1", "jwks"] and method == "GET":
            return json_response(self.tokens.jwks(), content_type="application/jwk-set+json")
        # every request sees the writes that finished before it, through whichever API worker
        # (one process: nothing to wait for)
        await self.store.sync()
        user = self.authn.authenticate(request.headers.get("Authorization")) if self.require_auth else ADMIN
        request[AUDIT_USER] = user
        user = self.authz.impersonate(request.headers.items(), user)
        request["user"] = user
        self.authz.check(rbac.request_info(user, method, request.path, query))
        if segments == ["metrics"] and method == "GET":
            return devcluster_metrics.response()
        accept = request.headers.get("Accept", "")
        if not segments:
            paths = ["/api", "/api/v1", "/apis", "/healthz", "/livez", "/openapi/v3", "/readyz", "/version"]
            return json_response({"paths": paths})
        if segments[0] == "openapi":
            return self._openapi(segments)
        if segments[0] not in ("api", "apis"):
            raise errors.not_found_path()
        if method == "GET":
            doc = self._discovery(segments, accept)
            if doc is not None:
                return doc
        target = parse_resource_path(segments)
        if target is None:
            raise errors.not_found_path()
        rt = self.registry.lookup(target.group, target.version, target.resource)
        if rt is None:
            raise errors.not_found_path()
        if target.namespace is not None and not rt.namespaced:
            raise errors.not_found_path()
        if target.subresource and target.subresource not in rt.subresources:
            raise errors.not_found_path()
        return await self._resource(request, rt, target, query, accept)

    def _discovery(self, segments: list[str], accept: str) -> web.Response | None:
        if segments == ["api"] or segments == ["apis"]:
            media = discovery.wants_aggregated(accept)
            if media is not None:
                return json_response(discovery.aggregated(self.registry, core=segments == ["api"]), content_type=media)
            if segments == ["api"]:
                return json_response(discovery.api_versions(self.address))
            return json_response(discovery.api_group_list(self.registry))
        if segments == ["api", "v1"]:
            return json_response(discovery.resource_list(self.registry, "", "v1"))
        if segments[0] == "apis" and len(segments) == 2:
            group = discovery.api_group(self.registry, segments[1])
            if group is None:
                raise errors.not_found_path()
            return json_response(group)
        if segments[0] == "apis" and len(segments) == 3:
            doc = discovery.resource_list(self.registry, segments[1], segments[2])
            if doc is None:
                raise errors.not_found_path()
            return json_response(doc)
        return None

    def _openapi(self, segments: list[str]) -> web.Response:
        if segments[:2] == ["openapi", "v3"]:
            if len(segments) == 2:
                return json_response(self.openapi.index())
            doc = self.openapi.document("/".join(segments[2:]))
            if doc is not None:
                return json_response(doc)
        raise errors.not_found_path()

    # ---------------------------------------------------------------- resources

    async def _resource(self, request: web.Request, rt: ResourceType, target: Target, query: dict[str, str],
                        accept: str) -> web.StreamResponse:
        method, name, sub = request.method, target.name, target.subresource
        ns = target.namespace if rt.namespaced else None
        as_table = tables.wants_table(accept)
        if rt.virtual:
            if method != "POST" or name is not None:
                raise errors.method_not_allowed(method, rt.qualified_resource, rt.group, rt.resource)
            review = await decode_object(request)
            return json_response(self.authz.review(rt, review, request["user"], ns), 201)
        handler = self.subresources.handler(sub, name)
        if handler is not None and name is not None:
            return await handler(request, rt, ns, name, query)
        if name is None:
            if method == "GET":
                if parse_bool(query.get("watch"), "watch"):
                    return await self._watch(request, rt, ns, query, as_table)
                return self._list(rt, ns, query, as_table)
            if method == "POST":
                opts = write_options(request, query, None)
                body = await decode_object(request)
                if rt.namespaced and ns is None:
                    raise errors.method_not_allowed("POST", rt.qualified_resource, rt.group, rt.resource)
                obj = await self.api.create(rt, ns, body, opts)
                return json_response(self._written_body(rt, obj, opts), 201, warnings=opts.warnings)
            if method == "DELETE":
                options = await self._delete_options(request, query)
                await self.api.delete_collection(rt, ns, query.get("labelSelector", ""), query.get("fieldSelector", ""),
                                                 options, write_options(request, query, None))
                return json_response({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"})
            raise errors.method_not_allowed(method, rt.qualified_resource, rt.group, rt.resource)
        if rt.namespaced and ns is None:
            raise errors.not_found_path()
        if method == "GET":
            raw = self.api.get_raw(rt, ns, name)
            if as_table:
                obj = json.loads(raw)
                return json_response(tables.table(rt, [obj], obj["metadata"].get("resourceVersion", ""),
                                               include_object=query.get("includeObject", "Metadata")),
                                  content_type=tables.TABLE_MEDIA_TYPE)
            return json_response(raw)
        if method == "PUT":
            if sub == "finalize":
                sub = None
            opts = write_options(request, query, sub)
            body = await decode_object(request)
            obj = await self.api.update(rt, ns, name, body, opts)
            return json_response(self._written_body(rt, obj, opts), warnings=opts.warnings)
        if method == "PATCH":
            opts = write_options(request, query, sub)
            content_type = (request.headers.get("Content-Type") or "").split(";")[0].strip().lower()
            patch_type = PATCH_TYPES.get(content_type)
            if patch_type is None or (patch_type == "strategic" and not rt.builtin):
                raise errors.unsupported_media_type(machinery.BUILTIN_PATCH_TYPES if rt.builtin else machinery.CR_PATCH_TYPES)
            body = await read_body(request)
            if patch_type == "apply" and not sub and self.api.store.get(rt.storage_key, ns or "", name) is None:
                self.authz.check_create_on_update(request["user"], rt, ns, name)
            code, obj = await self.api.patch(rt, ns, name, patch_type, body, opts)
            return json_response(self._written_body(rt, obj, opts), code, warnings=opts.warnings)
        if method == "DELETE":
            if sub:
                raise errors.method_not_allowed(method, rt.qualified_resource, rt.group, rt.resource)
            options = await self._delete_options(request, query)
            body, _ = await self.api.delete(rt, ns, name, options, write_options(request, query, None))
            return json_response(body)
        raise errors.method_not_allowed(method, rt.qualified_resource, rt.group, rt.resource)

    async def _delete_options(self, request: web.Request, query: dict[str, str]) -> dict[str, Any]:
        body = await read_body(request)
        options: dict[str, Any] = {}
        if body.strip():
            try:
                options = machinery.loads(body)
            except (ValueError, UnicodeDecodeError) as err:
                raise errors.bad_request(f"error decoding DeleteOptions: {err}") from err
            if not isinstance(options, dict):
                raise errors.bad_request("DeleteOptions must be a JSON object")
        if "propagationPolicy" in query:
            options["propagationPolicy"] = query["propagationPolicy"]
        if "orphanDependents" in query:
            options["orphanDependents"] = parse_bool(query["orphanDependents"], "orphanDependents")
        if "gracePeriodSeconds" in query:
            try:
                options["gracePeriodSeconds"] = int(query["gracePeriodSeconds"])
            except ValueError:
                raise errors.bad_request(f"gracePeriodSeconds: invalid integer {query['gracePeriodSeconds']!r}") from None
        if query.get("dryRun") == "All":
            options["dryRun"] = ["All"]
        return options

    def _list(self, rt: ResourceType, ns: str | None, query: dict[str, str], as_table: bool) -> web.Response:
        rv, items = self.api.list(rt, ns, query.get("labelSelector", ""), query.get("fieldSelector", ""))
        if as_table:
            objs = [self.api.view(rt, s.load()) for s in items]
            return json_response(tables.table(rt, objs, str(rv), include_object=query.get("includeObject", "Metadata")),
                              content_type=tables.TABLE_MEDIA_TYPE)
        head = dumps({"kind": f"{rt.kind}List", "apiVersion": rt.api_version, "metadata": {"resourceVersion": str(rv)}})
        if self.api.needs_view(rt):
            parts = [dumps(self.api.view(rt, s.load())) for s in items]
        else:
            parts = [s.raw for s in items]
        body = head[:-1] + b',"items":[' + b",".join(parts) + b"]}"
        return json_response(body)

    # ---------------------------------------------------------------- watch

    async def _watch(self, request: web.Request, rt: ResourceType, ns: str | None, query: dict[str, str],
                     as_table: bool) -> web.StreamResponse:
        options = watch.parse_watch_options(query, parse_bool)
        return await watch.stream(request, self.api, rt, ns, options, as_table, self._stopping)


def _request_labels(request: web.Request) -> tuple[str, str, str, str]:
    """(verb, group, resource, subresource) of a request, as kube-apiserver labels it."""
    segments = [unquote(s) for s in request.rel_url.raw_path.split("/") if s]
    target = parse_resource_path(segments) if segments and segments[0] in ("api", "apis") else None
    if target is None:
        path = "/" + "/".join(segments[:1]) if segments else "/"
        verb = request.method if request.method != "GET" else "GET"
        return verb, "", path, ""
    watch = request.rel_url.query.get("watch", "") in ("1", "true", "True")
    verb = devcluster_metrics.verb_of(request.method, target.name is not None, watch,
                                      (request.headers.get("Content-Type") or "").lower())
    return verb, target.group, target.resource, target.subresource or ""


ReadyCallback = Callable[[str, int], Awaitable[None] | None]


async def serve(data_dir: Path, host: str = "127.0.0.1", port: int = 6443, tls: bool = True, history_size: int = 4096,
                on_ready: ReadyCallback | None = None, stop: asyncio.Event | None = None,
                authorization_mode: str = "RBAC", audit_log_path: str | None = None, server: ApiServer | None = None,
                reuse_port: bool = False) -> None:
    """Run the API server until ``stop`` is set (or the task is cancelled). ``server``: one made
    by the caller (an API worker's, over its replica); ``reuse_port``: listen beside the other
    API workers on the same port (SO_REUSEPORT: the kernel spreads connections over them)."""
    credentials = ensure_credentials(data_dir)
    if server is None:
        server = ApiServer(data_dir, credentials, history_size=history_size, authorization_mode=authorization_mode)
    if audit_log_path:
        server.audit = AuditLog(audit_log_path)
    await server.start()
    eventloop.freeze_startup()
    runner = web.AppRunner(server.make_app(), access_log=None, handle_signals=False, shutdown_timeout=1.0)
    await runner.setup()
    ssl_context = None
    if tls:
        ssl_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ssl_context.load_cert_chain(credentials.server_cert, credentials.server_key)
    site = web.TCPSite(runner, host, port, ssl_context=ssl_context, reuse_address=True, reuse_port=reuse_port or None,
                       backlog=1024)
    try:
        await site.start()
        sockets = site._server.sockets if site._server is not None else []  # type: ignore[union-attr]
        bound = sockets[0].getsockname()[1] if sockets else port
        server.address = f"{host}:{bound}"
        url = f"{'https' if tls else 'http'}://{host}:{bound}"
        server.tokens.issuer = url
        if on_ready is not None:
            result = on_ready(url, bound)
            if asyncio.iscoroutine(result):
                await result
        await (stop.wait() if stop is not None else asyncio.Event().wait())
    finally:
        await server.stop_watches()
        await runner.cleanup()
        await server.stop()
