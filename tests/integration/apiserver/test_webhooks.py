"""Admission webhooks: the devcluster calls real HTTPS webhook servers (AdmissionReview v1)."""
from __future__ import annotations

import base64
import json
import ssl

import httpx
import pytest
from aiohttp import web

from trainyard_services.devcluster.tls import ensure_credentials

CM = "/api/v1/namespaces/default/configmaps"


@pytest.fixture
async def webhook_server(tmp_path):
    """An HTTPS webhook server: /mutate adds a label, /validate denies objects labelled deny=yes."""
    creds = ensure_credentials(tmp_path / "hook")
    seen: list[dict] = []

    async def mutate(request: web.Request) -> web.Response:
        review = await request.json()
        seen.append(review["request"])
        patch = [{"op": "add", "path": "/metadata/labels/mutated", "value": "yes"}]
        return web.json_response({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": {
            "uid": review["request"]["uid"], "allowed": True, "patchType": "JSONPatch",
            "patch": base64.b64encode(json.dumps(patch).encode()).decode()}})

    async def validate(request: web.Request) -> web.Response:
        review = await request.json()
        seen.append(review["request"])
        labels = ((review["request"].get("object") or {}).get("metadata") or {}).get("labels") or {}
        allowed = labels.get("deny") != "yes"
        response = {"uid": review["request"]["uid"], "allowed": allowed, "warnings": ["checked by test"]}
        if not allowed:
            response["status"] = {"code": 403, "reason": "Forbidden", "message": "deny label is set"}
        return web.json_response({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response})

    app = web.Application()
    app.router.add_post("/mutate", mutate)
    app.router.add_post("/validate", validate)
    runner = web.AppRunner(app)
    await runner.setup()
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(creds.server_cert, creds.server_key)
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    ca = base64.b64encode(creds.ca_cert.read_bytes()).decode()
    try:
        yield f"https://127.0.0.1:{port}", ca, seen
    finally:
        await runner.cleanup()


def _hook(name: str, url: str, ca: str, policy: str = "Fail", selector: dict | None = None) -> dict:
    hook = {"name": name, "clientConfig": {"url": url, "caBundle": ca}, "admissionReviewVersions": ["v1"],
            "sideEffects": "None", "failurePolicy": policy, "timeoutSeconds": 5,
            "rules": [{"operations": ["CREATE", "UPDATE"], "apiGroups": [""], "apiVersions": ["v1"],
                       "resources": ["configmaps"], "scope": "Namespaced"}]}
    if selector:
        hook["objectSelector"] = selector
    return hook


async def test_mutating_and_validating_webhooks_are_called(devcluster, webhook_server):
    url, ca, seen = webhook_server
    ctx = ssl.create_default_context(cafile=str(devcluster.ca_cert))
    async with httpx.AsyncClient(base_url=devcluster.url, verify=ctx, timeout=20,
                                 headers={"Authorization": f"Bearer {devcluster.token}"}) as c:
        mwc = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
               "metadata": {"name": "labeller"}, "webhooks": [_hook("labeller.example.com", url + "/mutate", ca,
                                                                      selector={"matchLabels": {"hooked": "yes"}})]}
        vwc = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
               "metadata": {"name": "guard"}, "webhooks": [
                   _hook("guard.example.com", url + "/validate", ca),
                   _hook("absent.example.com", "https://127.0.0.1:1/none", ca, policy="Ignore")]}
        assert (await c.post("/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations", json=mwc)).status_code == 201
        assert (await c.post("/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations", json=vwc)).status_code == 201

        ok = await c.post(CM, json={"apiVersion": "v1", "kind": "ConfigMap",
                                    "metadata": {"name": "hooked", "labels": {"hooked": "yes"}}})
        assert ok.status_code == 201, ok.text
        assert ok.json()["metadata"]["labels"]["mutated"] == "yes"
        assert ok.headers.get("Warning") == '299 - "checked by test"'
        plain = await c.post(CM, json={"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "plain"}})
        assert "mutated" not in (plain.json()["metadata"].get("labels") or {})  # objectSelector did not match

        denied = await c.post(CM, json={"apiVersion": "v1", "kind": "ConfigMap",
                                        "metadata": {"name": "denied", "labels": {"deny": "yes"}}})
        assert denied.status_code == 403
        assert denied.json()["message"] == 'admission webhook "guard.example.com" denied the request: deny label is set'
        assert (await c.get(CM + "/denied")).status_code == 404
        assert {r["operation"] for r in seen} == {"CREATE"}
        assert all(r["kind"] == {"group": "", "version": "v1", "kind": "ConfigMap"} for r in seen)

        vwc2 = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
                "metadata": {"name": "broken"}, "webhooks": [_hook("broken.example.com", "https://127.0.0.1:1/x", ca)]}
        await c.post("/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations", json=vwc2)
        failed = await c.post(CM, json={"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "blocked"}})
        assert failed.status_code == 500
        assert 'failed calling webhook "broken.example.com"' in failed.json()["message"]
