"""The JobSet admission webhook, served by the data plane and registered with the API server.

Upstream JobSet defaults and validates JobSets in a webhook; the devcluster does the same: an
HTTPS endpoint on 127.0.0.1 (a self-signed certificate made at start-up, trusted through the
configuration's ``caBundle``) plus a Mutating and a Validating WebhookConfiguration. They use
``failurePolicy: Ignore`` so a devcluster started later without the data plane is not blocked
by a stale registration; a clean stop removes them.
"""
from __future__ import annotations

import base64
import datetime as dt
import json
import logging
import ssl
import tempfile
from pathlib import Path
from typing import Any

from aiohttp import web

from trainyard.errortext import describe
from trainyard.kube.client import KubeClient, KubeError
from trainyard.kube.resources import Resource
from trainyard.security import pki

from .admission import default_jobset, validate_jobset

log = logging.getLogger(__name__)
MUTATE_PATH = "/mutate-jobset-x-k8s-io-v1alpha2-jobset"
VALIDATE_PATH = "/validate-jobset-x-k8s-io-v1alpha2-jobset"
CONFIG_NAME = "trainyard-dataplane-jobset"
MUTATING = Resource("admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations",
                    "MutatingWebhookConfiguration", False)
VALIDATING = Resource("admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations",
                      "ValidatingWebhookConfiguration", False)


def serving_certificate() -> tuple[bytes, bytes, bytes]:
    """(certificate chain PEM, key PEM, CA PEM) for 127.0.0.1, from the one CA helper."""
    bundle = pki.issue(["127.0.0.1", "localhost"], ca_common_name="trainyard-dataplane-webhook-ca",
                       common_name="trainyard-dataplane-webhook", cert_validity=dt.timedelta(days=3650))
    return bundle.chain_pem, bundle.key_pem, bundle.ca_cert_pem


def review_response(review: dict[str, Any], mutate: bool, gates: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The AdmissionReview answer for one JobSet request (pure); ``gates``: JobSet feature gates on."""
    request = review.get("request") or {}
    response: dict[str, Any] = {"uid": request.get("uid", ""), "allowed": True}
    obj = request.get("object") or {}
    if mutate:
        if request.get("operation") == "CREATE":
            defaulted = default_jobset(obj)
            if defaulted.get("spec") != obj.get("spec"):
                patch = [{"op": "add" if "spec" not in obj else "replace", "path": "/spec",
                          "value": defaulted["spec"]}]
                response["patchType"] = "JSONPatch"
                response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    else:
        old = request.get("oldObject") if request.get("operation") == "UPDATE" else None
        errors = validate_jobset(obj, old, gates)
        if errors:
            response["allowed"] = False
            response["status"] = {"code": 403, "reason": "Forbidden", "message": ", ".join(errors)}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


class JobSetWebhook:
    def __init__(self, client: KubeClient, gates: frozenset[str] = frozenset()) -> None:
        self.client = client
        self.gates = gates
        self.runner: web.AppRunner | None = None
        self.port = 0
        self.ca_bundle = ""

    async def _handle(self, request: web.Request, mutate: bool) -> web.Response:
        try:
            review = await request.json()
        except (ValueError, json.JSONDecodeError):
            return web.json_response({"message": "body is not an AdmissionReview"}, status=400)
        return web.json_response(review_response(review, mutate, self.gates))

    async def start(self) -> None:
        cert, key, ca = serving_certificate()
        self.ca_bundle = base64.b64encode(ca).decode()
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        with tempfile.TemporaryDirectory(prefix="trainyard-webhook-") as tmp:
            cert_file, key_file = Path(tmp) / "tls.crt", Path(tmp) / "tls.key"
            cert_file.write_bytes(cert)
            key_file.write_bytes(key)
            context.load_cert_chain(cert_file, key_file)
        app = web.Application()
        app.router.add_post(MUTATE_PATH, lambda r: self._handle(r, True))
        app.router.add_post(VALIDATE_PATH, lambda r: self._handle(r, False))
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0, ssl_context=context)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]  # noqa: SLF001
        await self._register()

    def _webhook(self, name: str, path: str, operations: list[str]) -> dict[str, Any]:
        return {"name": name, "admissionReviewVersions": ["v1"], "sideEffects": "None",
                "failurePolicy": "Ignore", "timeoutSeconds": 10,
                "clientConfig": {"url": f"https://127.0.0.1:{self.port}{path}", "caBundle": self.ca_bundle},
                "rules": [{"operations": operations, "apiGroups": ["jobset.x-k8s.io"],
                           "apiVersions": ["v1alpha2"], "resources": ["jobsets"], "scope": "Namespaced"}]}

    async def _register(self) -> None:
        configs = [
            (MUTATING, {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
                        "metadata": {"name": CONFIG_NAME},
                        "webhooks": [self._webhook("mjobset.kb.io", MUTATE_PATH, ["CREATE"])]}),
            (VALIDATING, {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
                          "metadata": {"name": CONFIG_NAME},
                          "webhooks": [self._webhook("vjobset.kb.io", VALIDATE_PATH, ["CREATE", "UPDATE"])]}),
        ]
        for resource, body in configs:
            existing = await self.client.get(resource, None, CONFIG_NAME)
            if existing is None:
                await self.client.create(resource, None, body)
            else:
                body["metadata"]["resourceVersion"] = existing["metadata"].get("resourceVersion")
                await self.client.request("PUT", resource.path(None, CONFIG_NAME), body=body)

    async def stop(self) -> None:
        for resource in (MUTATING, VALIDATING):
            try:
                await self.client.request("DELETE", resource.path(None, CONFIG_NAME), body={})
            except KubeError as err:
                if not err.not_found:
                    log.warning("webhook configuration not removed: %s", describe(err))
        if self.runner is not None:
            await self.runner.cleanup()
