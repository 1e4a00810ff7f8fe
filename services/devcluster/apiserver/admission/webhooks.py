"""Admission webhooks: Mutating then Validating webhook configurations, AdmissionReview v1.

The server calls each matching webhook over HTTPS (trusting its ``caBundle``), honouring
``rules`` (operations, groups, versions, resources incl. ``x/status``, scope),
``namespaceSelector``, ``objectSelector``, ``failurePolicy`` and ``timeoutSeconds``. Mutating
webhooks answer JSON patches that are applied in order; a denial becomes the client's error as
upstream words it: ``admission webhook "<name>" denied the request: <message>``.
"""
from __future__ import annotations

import asyncio
import base64
import functools
import json
import logging
import ssl
import random
import uuid
from dataclasses import dataclass
from typing import Any

import aiohttp

from trainyard.apimachinery.admission_policy import request_matches_rule
from trainyard.apimachinery.json_patch import apply_json_patch
from trainyard.apimachinery.selectors import label_selector_from_struct
from trainyard.errortext import describe

from .. import errors
from ..registry.options import WriteOptions
from ..errors import ApiError
from ..registry.kinds import ResourceType
from ...storage.store import Store

log = logging.getLogger("trainyard.devcluster.webhooks")

MUTATING = ("admissionregistration.k8s.io", "mutatingwebhookconfigurations")
VALIDATING = ("admissionregistration.k8s.io", "validatingwebhookconfigurations")


def rule_matches(rule: dict[str, Any], operation: str, rt: ResourceType, subresource: str) -> bool:
    """A webhook rule against the request: the same matching as ValidatingAdmissionPolicies'."""
    return request_matches_rule(rule, operation, rt.group, rt.version, rt.resource, subresource, rt.namespaced)


def _selector_matches(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    if not selector:
        return True
    return label_selector_from_struct(selector).matches(labels)


@functools.lru_cache(maxsize=64)
def _ssl_context(ca_bundle: str | None) -> ssl.SSLContext:
    # One context per caBundle: aiohttp pools connections per SSL context, so a fresh
    # context on every call would mean a new TLS handshake for every admission request.
    if ca_bundle:
        ctx = ssl.create_default_context(cadata=base64.b64decode(ca_bundle).decode())
    else:
        ctx = ssl.create_default_context()
    return ctx


def _url(client_config: dict[str, Any]) -> str:
    if client_config.get("url"):
        return client_config["url"]
    service = client_config.get("service") or {}
    path = service.get("path") or "/"
    return f"https://{service.get('name')}.{service.get('namespace')}.svc:{service.get('port', 443)}{path}"


@dataclass(frozen=True)
class Target:
    """Where one call goes: the URL to connect to and the TLS name to verify."""

    url: str
    server_hostname: str | None = None


class NoEndpoints(Exception):
    """The webhook's Service has no ready endpoint (or does not exist)."""


def service_targets(store: Store, service_ref: dict[str, Any]) -> list[Target]:
    """A ``clientConfig.service`` resolved the way kube-proxy would route it: the Service's port
    (``port``, default 443) -> its name -> that named port of each ready endpoint of the
    Service's EndpointSlices. The certificate is verified against ``<name>.<namespace>.svc``,
    as kube-apiserver does, while the connection goes to the endpoint's address."""
    name, namespace = service_ref.get("name", ""), service_ref.get("namespace", "")
    path = service_ref.get("path") or "/"
    stored = store.get(("", "services"), namespace, name)
    if stored is None:
        raise NoEndpoints(f'service "{name}" not found')
    wanted = int(service_ref.get("port") or 443)
    spec_ports = (stored.load().get("spec") or {}).get("ports") or []
    port_name = next((p.get("name") or "" for p in spec_ports if p.get("port") == wanted), None)
    if port_name is None:
        raise NoEndpoints(f'service "{name}" has no port {wanted}')
    targets: list[Target] = []
    for _, slice_ in store.list(("discovery.k8s.io", "endpointslices"), namespace):
        body = slice_.load()
        if ((body.get("metadata") or {}).get("labels") or {}).get("kubernetes.io/service-name") != name:
            continue
        ports = [p.get("port") for p in body.get("ports") or [] if (p.get("name") or "") == port_name]
        for endpoint in body.get("endpoints") or []:
            if (endpoint.get("conditions") or {}).get("ready") is False:
                continue
            for address in endpoint.get("addresses") or []:
                host = f"[{address}]" if ":" in address else address
                targets.extend(Target(f"https://{host}:{port}{path}", f"{name}.{namespace}.svc")
                               for port in ports if port)
    if not targets:
        raise NoEndpoints(f'no endpoints available for service "{name}"')
    return targets


class Webhooks:
    """The stored Mutating/ValidatingWebhookConfigurations and the calls to their webhooks."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._session: Any = None
        self._fresh_session: Any = None  # one connection per request: for a resend (see _send)
        # Parsed configurations per kind, kept while their resourceVersions stay the same:
        # parsing every configuration on every write was a tenth of the server's CPU.
        self._parsed: dict[tuple[str, str], tuple[tuple[int, ...], list[dict[str, Any]]]] = {}

    def _configurations(self, key: tuple[str, str]) -> list[dict[str, Any]]:
        listed = self.store.list(key)
        versions = tuple(stored.rv for _, stored in listed)
        cached = self._parsed.get(key)
        if cached is None or cached[0] != versions:
            cached = self._parsed[key] = (versions, [stored.load() for _, stored in listed])
        return cached[1]

    def _namespace_labels(self, rt: ResourceType, obj: dict[str, Any] | None, old: dict[str, Any] | None) -> dict[str, str]:
        target = obj or old or {}
        if rt.storage_key == ("", "namespaces"):
            return dict((target.get("metadata") or {}).get("labels") or {})
        namespace = (target.get("metadata") or {}).get("namespace")
        if not namespace:
            return {}
        stored = self.store.get(("", "namespaces"), "", namespace)
        return dict(stored.labels) if stored else {}

    def _hooks(self, key: tuple[str, str]) -> list[tuple[str, dict[str, Any]]]:
        """Every webhook of every configuration of one kind, configurations in name order and
        webhooks in their order within it (kube-apiserver sorts configurations by name), each
        with its identity ``<configuration>/<webhook>/<index>`` for reinvocation."""
        found = []
        for configuration in sorted(self._configurations(key), key=lambda c: c["metadata"]["name"]):
            for index, hook in enumerate(configuration.get("webhooks") or []):
                found.append((f'{configuration["metadata"]["name"]}/{hook.get("name", "")}/{index}', hook))
        return found

    def _hook_matches(self, hook: dict[str, Any], operation: str, rt: ResourceType, obj: dict[str, Any] | None,
                      old: dict[str, Any] | None, subresource: str) -> bool:
        """``rules``, then ``namespaceSelector`` (namespaced kinds and namespaces themselves),
        then ``objectSelector`` on the new or the old object."""
        if not any(rule_matches(rule, operation, rt, subresource) for rule in hook.get("rules") or []):
            return False
        if rt.namespaced or rt.storage_key == ("", "namespaces"):
            if not _selector_matches(hook.get("namespaceSelector"), self._namespace_labels(rt, obj, old)):
                return False
        selector = hook.get("objectSelector")
        if not selector:
            return True
        labels_new = dict(((obj or {}).get("metadata") or {}).get("labels") or {})
        labels_old = dict(((old or {}).get("metadata") or {}).get("labels") or {})
        return _selector_matches(selector, labels_new) or (old is not None and _selector_matches(selector, labels_old))

    def has_mutating(self) -> bool:
        return bool(self._configurations(MUTATING))

    async def mutate(self, operation: str, rt: ResourceType, obj: dict[str, Any] | None, old: dict[str, Any] | None,
                     opts: WriteOptions) -> dict[str, Any] | None:
        """Mutating admission: the matching mutating webhooks in order, each seeing the object as
        the ones before it left it; returns the changed object, or None when nothing changed.

        ``reinvocationPolicy: IfNeeded``: when a webhook changes the object, every webhook with
        IfNeeded called before it is due again, and they are called once more, in order, in a
        second round (kube-apiserver's mutating dispatcher and its reinvocation context; never a
        third round)."""
        hooks = self._hooks(MUTATING)
        if not hooks:
            return None
        subresource = opts.subresource or ""
        current = obj
        changed = False
        invoked_reinvocable: set[str] = set()
        due_again: set[str] = set()
        for round_ in (0, 1):
            if round_ == 1 and not due_again:
                break
            for uid, hook in hooks:
                if round_ == 1 and uid not in due_again:
                    continue
                if not self._hook_matches(hook, operation, rt, current, old, subresource):
                    continue
                patched = await self._mutate_once(hook, operation, rt, current, old, opts)
                if patched is not None and patched != current:
                    current, changed = patched, True
                    due_again |= invoked_reinvocable
                    invoked_reinvocable = set()
                if hook.get("reinvocationPolicy") == "IfNeeded":
                    invoked_reinvocable.add(uid)
        return current if changed else None

    async def _mutate_once(self, hook: dict[str, Any], operation: str, rt: ResourceType, obj: dict[str, Any] | None,
                           old: dict[str, Any] | None, opts: WriteOptions) -> dict[str, Any] | None:
        """One mutating webhook call: the patched object, or None when it answered no patch."""
        response = await self._call(hook, operation, rt, obj, old, opts)
        if response is None or obj is None:
            return None
        patch = response.get("patch")
        if not patch:
            return None
        if response.get("patchType", "JSONPatch") != "JSONPatch":
            raise errors.internal(f'webhook "{hook.get("name")}" returned an unsupported patchType')
        try:
            return apply_json_patch(obj, json.loads(base64.b64decode(patch)))
        except ValueError as err:
            raise errors.internal(f'failed to apply the patch of webhook "{hook.get("name")}": {err}') from err

    async def validate(self, operation: str, rt: ResourceType, obj: dict[str, Any] | None, old: dict[str, Any] | None,
                       opts: WriteOptions) -> None:
        """Validating admission's webhooks: every matching one is called at once with the object
        about to be stored; all are awaited, and the first refusal (in configuration order) is
        the answer."""
        subresource = opts.subresource or ""
        hooks = [hook for _, hook in self._hooks(VALIDATING)
                 if self._hook_matches(hook, operation, rt, obj, old, subresource)]
        if not hooks:
            return
        outcomes = await asyncio.gather(*(self._call(hook, operation, rt, obj, old, opts) for hook in hooks),
                                        return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome

    async def _call(self, hook: dict[str, Any], operation: str, rt: ResourceType, obj: dict[str, Any] | None,
                    old: dict[str, Any] | None, opts: WriteOptions) -> dict[str, Any] | None:
        name = hook.get("name", "")
        meta = (obj or old or {}).get("metadata") or {}
        gvk = {"group": rt.group, "version": rt.version, "kind": rt.kind}
        if opts.subresource == "scale":
            # a scale request's object is the autoscaling/v1 Scale, as kube-apiserver sends it
            gvk = {"group": "autoscaling", "version": "v1", "kind": "Scale"}
        gvr = {"group": rt.group, "version": rt.version, "resource": rt.resource}
        review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
            "uid": str(uuid.uuid4()), "kind": gvk, "resource": gvr, "requestKind": gvk, "requestResource": gvr,
            "name": meta.get("name", ""), "operation": operation,
            # the requesting (or impersonated) user, as kube-apiserver sends it; internal writes: the admin
            "userInfo": opts.user.as_json() if opts.user is not None else
            {"username": "devcluster-admin", "groups": ["system:masters", "system:authenticated"]},
            "object": obj, "oldObject": old, "dryRun": bool(opts.dry_run),
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": f"{operation.capitalize()}Options",
                        "fieldManager": opts.manager} if operation != "DELETE" else
            {"apiVersion": "meta.k8s.io/v1", "kind": "DeleteOptions"}}}
        if rt.namespaced:
            review["request"]["namespace"] = meta.get("namespace", "")
        if opts.subresource:
            review["request"]["subResource"] = opts.subresource
            review["request"]["requestSubResource"] = opts.subresource
        client_config = hook.get("clientConfig") or {}
        timeout = float(hook.get("timeoutSeconds") or 10)
        fail_open = hook.get("failurePolicy", "Fail") == "Ignore"
        try:
            if self._session is None or self._session.closed:
                self._session = aiohttp.ClientSession()
            answer = await self._post(client_config, review, timeout)
            response = answer.get("response") if isinstance(answer, dict) else None
            if not isinstance(response, dict):
                raise _BadResponse("the webhook answered no AdmissionReview response")
        except ApiError:
            raise
        except Exception as err:  # noqa: BLE001 - any call failure goes through failurePolicy
            if fail_open:
                log.warning("webhook %s failed (ignored by failurePolicy): %s", name, describe(err))
                return None
            raise errors.internal(_failure_message(name, client_config, timeout, err)) from err
        for warning in response.get("warnings") or []:
            opts.warnings.append(str(warning))
        if not response.get("allowed"):
            raise _denied(name, response.get("status") or {})
        return response

    def _targets(self, client_config: dict[str, Any]) -> list[Target]:
        if client_config.get("url") or not client_config.get("service"):
            return [Target(_url(client_config))]
        targets = service_targets(self.store, client_config["service"])
        random.shuffle(targets)  # spread calls over the replicas, as a Service's routing does
        return targets

    async def _post(self, client_config: dict[str, Any], review: dict[str, Any], timeout: float) -> Any:
        """One AdmissionReview POST. A Service-backed webhook whose endpoint refuses or drops the
        connection before answering (a replica that just died) is tried on its next ready
        endpoint: a documented difference from kube-apiserver, which calls once. Timeouts and
        answers are never retried."""
        targets = self._targets(client_config)
        ssl_context = _ssl_context(client_config.get("caBundle"))
        deadline = asyncio.get_running_loop().time() + timeout
        for attempt, target in enumerate(targets):
            try:
                return await self._send(target, review, ssl_context, deadline)
            except (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError) as err:
                if attempt == len(targets) - 1:
                    raise
                log.info("webhook endpoint %s unreachable (%s); trying the next one", target.url, describe(err))
        raise NoEndpoints("no endpoint answered")

    async def _send(self, target: Target, review: dict[str, Any], ssl_context: ssl.SSLContext,
                    deadline: float) -> Any:
        """POSTs the review to one endpoint over a kept-alive connection. When that connection
        fails before any answer (the server closed it as idle while the request was on its way:
        the close crossed the request), the review goes once more over a new connection, as Go's
        HTTP transport, which kube-apiserver uses, resends a request whose reused connection
        was closed under it. A review has no side effects, so sending it twice is safe. A new
        connection that fails is the endpoint's failure."""
        try:
            return await self._post_over(self._session, target, review, ssl_context, deadline)
        except aiohttp.ClientConnectorError:
            raise  # no connection could be made: nothing was reused
        except (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError) as err:
            log.info("webhook endpoint %s closed a kept-alive connection (%s); sending again on a new one",
                     target.url, describe(err))
        if self._fresh_session is None or self._fresh_session.closed:
            self._fresh_session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))
        return await self._post_over(self._fresh_session, target, review, ssl_context, deadline)

    @staticmethod
    async def _post_over(session: aiohttp.ClientSession, target: Target, review: dict[str, Any],
                         ssl_context: ssl.SSLContext, deadline: float) -> Any:
        remaining = max(deadline - asyncio.get_running_loop().time(), 0.001)
        async with session.post(target.url, json=review, ssl=ssl_context, server_hostname=target.server_hostname,
                                timeout=aiohttp.ClientTimeout(total=remaining)) as resp:
            if resp.status != 200:
                raise RuntimeError(f"the server responded with status {resp.status}")
            return await resp.json(content_type=None)


class _BadResponse(Exception):
    """The webhook answered, but not an AdmissionReview with a response."""


def _failure_message(name: str, client_config: dict[str, Any], timeout: float, err: Exception) -> str:
    """kube-apiserver's words for a webhook that could not be called (``ErrCallingWebhook``):
    ``failed calling webhook "<name>": failed to call webhook: Post "<url>?timeout=<n>s": <why>``
    (the URL as configured: a Service's is its ``https://<name>.<namespace>.svc:<port>`` form),
    or ``... received invalid webhook response: <why>`` when it answered something else."""
    if isinstance(err, _BadResponse):
        return f'failed calling webhook "{name}": received invalid webhook response: {err}'
    if isinstance(err, asyncio.TimeoutError):
        why = "context deadline exceeded"
    else:
        why = describe(err)
    url = f"{_url(client_config)}?timeout={int(timeout)}s"
    return f'failed calling webhook "{name}": failed to call webhook: Post "{url}": {why}'


def _denied(name: str, result: dict[str, Any]) -> ApiError:
    denied_by = f'admission webhook "{name}" denied the request'
    code = int(result.get("code") or 0)
    if code < 400:
        code = 400
    if result.get("message"):
        message = f"{denied_by}: {result['message']}"
    elif result.get("reason"):
        message = f"{denied_by}: {result['reason']}"
    else:
        message = f"{denied_by} without explanation"
    return ApiError(code, str(result.get("reason") or ""), message, result.get("details"))
