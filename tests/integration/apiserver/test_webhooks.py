"""Admission webhooks: the devcluster calls real HTTPS webhook servers (AdmissionReview v1).

One devcluster per module (and worker count, conftest.py); each test starts its own webhook
servers, and its webhook configurations are deleted after it (``clean``), so no test's hooks
see another test's writes. Each test's objects have names of their own."""
from __future__ import annotations

import asyncio
import base64
import json
import ssl
from typing import Iterator

import httpx
import pytest
from aiohttp import web

from trainyard_services.devcluster.tls import ensure_credentials

CM = "/api/v1/namespaces/default/configmaps"
ADM = "/apis/admissionregistration.k8s.io/v1"


@pytest.fixture(scope="module")
def devcluster(devcluster_module):
    return devcluster_module


@pytest.fixture(autouse=True)
def clean(devcluster) -> Iterator[None]:
    yield
    with devcluster.client(timeout=20) as c:
        for kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
            assert c.delete(f"{ADM}/{kind}").status_code == 200


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

    async def slow(request: web.Request) -> web.Response:
        review = await request.json()
        await asyncio.sleep(0.3)  # every concurrent write is inside admission at once
        return web.json_response({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                  "response": {"uid": review["request"]["uid"], "allowed": True}})

    app = web.Application()
    app.router.add_post("/mutate", mutate)
    app.router.add_post("/validate", validate)
    app.router.add_post("/slow", slow)
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
    async with devcluster.async_client(timeout=20) as c:
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
        assert seen[-1]["userInfo"] == {"username": "devcluster-admin",
                                        "groups": ["system:masters", "system:authenticated"]}
        # the review names the requesting user, here an impersonated one (kubectl --as)
        jane = await c.post(CM, json={"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "by-jane"}},
                            headers={"Impersonate-User": "jane", "Impersonate-Group": "system:masters"})
        assert jane.status_code == 201, jane.text
        assert seen[-1]["userInfo"] == {"username": "jane", "groups": ["system:masters", "system:authenticated"]}

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


async def test_writes_with_one_resource_version_store_exactly_one_while_a_webhook_is_slow(devcluster, webhook_server):
    """Optimistic concurrency holds across admission: of eight patches carrying the same
    resourceVersion, exactly one is stored and seven answer 409, although all eight wait in
    a slow webhook together; patches without a precondition all land, none lost."""
    url, ca, _ = webhook_server
    async with devcluster.async_client(timeout=30) as c:
        vwc = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
               "metadata": {"name": "slow"}, "webhooks": [
                   _hook("slow.example.com", url + "/slow", ca, selector={"matchLabels": {"race": "yes"}})]}
        assert (await c.post("/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
                             json=vwc)).status_code == 201
        created = await c.post(CM, json={"apiVersion": "v1", "kind": "ConfigMap",
                                          "metadata": {"name": "race", "labels": {"race": "yes"}}})
        assert created.status_code == 201, created.text
        rv = created.json()["metadata"]["resourceVersion"]
        merge = {"Content-Type": "application/merge-patch+json"}

        async def claim(who: str):
            body = {"metadata": {"resourceVersion": rv, "annotations": {"owner": who}}}
            return await c.patch(f"{CM}/race", content=json.dumps(body), headers=merge)

        answers = await asyncio.gather(*(claim(f"writer-{i}") for i in range(8)))
        assert sorted(a.status_code for a in answers) == [200] + [409] * 7
        winner = next(a.json() for a in answers if a.status_code == 200)["metadata"]["annotations"]["owner"]
        assert (await c.get(f"{CM}/race")).json()["metadata"]["annotations"]["owner"] == winner

        async def add(index: int):
            return await c.patch(f"{CM}/race", content=json.dumps({"data": {f"k{index}": "v"}}), headers=merge)

        assert {a.status_code for a in await asyncio.gather(*(add(i) for i in range(6)))} == {200}
        assert {f"k{i}" for i in range(6)} <= set((await c.get(f"{CM}/race")).json()["data"])


async def test_applies_and_patches_racing_in_a_slow_webhook_all_land(devcluster, webhook_server):
    """An apply or a patch that loses its commit to a write made while it was in admission is
    computed again on the new object (GuaranteedUpdate), not answered 409: four managers'
    applies and four merge patches, all inside a slow webhook together, all answer 200 and the
    object holds every field, each apply manager owning its own; a PUT carrying the
    resourceVersion they all started from then answers 409."""
    url, ca, _ = webhook_server
    async with devcluster.async_client(timeout=30) as c:
        vwc = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
               "metadata": {"name": "slow-apply"}, "webhooks": [
                   _hook("slow-apply.example.com", url + "/slow", ca, selector={"matchLabels": {"apply-race": "yes"}})]}
        assert (await c.post("/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
                             json=vwc)).status_code == 201
        created = await c.post(CM, json={"apiVersion": "v1", "kind": "ConfigMap",
                                          "metadata": {"name": "apply-race", "labels": {"apply-race": "yes"}}})
        assert created.status_code == 201, created.text
        first = created.json()

        async def apply(index: int):
            config = {"apiVersion": "v1", "kind": "ConfigMap",
                      "metadata": {"name": "apply-race", "labels": {"apply-race": "yes"}},
                      "data": {f"applied-{index}": str(index)}}
            return await c.patch(f"{CM}/apply-race", params={"fieldManager": f"applier-{index}"},
                                 content=json.dumps(config), headers={"Content-Type": "application/apply-patch+yaml"})

        async def merge(index: int):
            return await c.patch(f"{CM}/apply-race", content=json.dumps({"data": {f"merged-{index}": "x"}}),
                                 headers={"Content-Type": "application/merge-patch+json"})

        answers = await asyncio.gather(*(apply(i) for i in range(4)), *(merge(i) for i in range(4)))
        assert [a.status_code for a in answers] == [200] * 8, [a.text for a in answers if a.status_code != 200]
        final = (await c.get(f"{CM}/apply-race")).json()
        assert set(final["data"]) == {f"applied-{i}" for i in range(4)} | {f"merged-{i}" for i in range(4)}
        owners = {e["manager"]: e for e in final["metadata"]["managedFields"] if e["operation"] == "Apply"}
        assert set(owners) == {f"applier-{i}" for i in range(4)}
        for i in range(4):
            assert f"f:applied-{i}" in owners[f"applier-{i}"]["fieldsV1"]["f:data"]
        stale = dict(first, data={"late": "1"})
        put = await c.put(f"{CM}/apply-race", json=stale)
        assert put.status_code == 409, put.text
        assert put.json()["reason"] == "Conflict"


@pytest.fixture
async def holding_webhook(tmp_path):
    """An HTTPS validating webhook that admits, but only once the test opens ``gate``; ``held``
    gets each request as it arrives (so a test knows a write is inside admission)."""
    creds = ensure_credentials(tmp_path / "hold")
    gate, held = asyncio.Event(), asyncio.Queue()

    async def hold(request: web.Request) -> web.Response:
        review = await request.json()
        await held.put(review["request"])
        await gate.wait()
        return web.json_response({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                  "response": {"uid": review["request"]["uid"], "allowed": True}})

    app = web.Application()
    app.router.add_post("/hold", hold)
    runner = web.AppRunner(app)
    await runner.setup()
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(creds.server_cert, creds.server_key)
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        yield f"https://127.0.0.1:{port}/hold", base64.b64encode(creds.ca_cert.read_bytes()).decode(), gate, held
    finally:
        gate.set()
        await runner.cleanup()


async def test_garbage_collection_during_a_slow_webhook_is_not_undone(devcluster, holding_webhook):
    """The store keeps one write order per object for every writer, the server's own garbage
    collector included: a dependent the collector deletes while an update of it waits in a
    webhook is not brought back by that update's commit (kube-apiserver's storage compares the
    resourceVersion at commit, and the update finds the object gone: 404)."""
    url, ca, gate, held = holding_webhook
    async with devcluster.async_client(timeout=30) as c:
        hook = _hook("hold.example.com", url, ca, selector={"matchLabels": {"race": "yes"}})
        hook["rules"][0]["operations"] = ["UPDATE"]
        hook["timeoutSeconds"] = 30
        vwc = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
               "metadata": {"name": "hold"}, "webhooks": [hook]}
        assert (await c.post("/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
                             json=vwc)).status_code == 201
        owner = (await c.post(CM, json={"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owner"}})).json()
        ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"]}
        dependent = await c.post(CM, json={"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
            "name": "dependent", "labels": {"race": "yes"}, "ownerReferences": [ref]}})
        assert dependent.status_code == 201, dependent.text

        update = asyncio.ensure_future(c.patch(f"{CM}/dependent", content=json.dumps({"data": {"late": "1"}}),
                                               headers={"Content-Type": "application/merge-patch+json"}))
        assert (await held.get())["name"] == "dependent"  # the patch waits inside admission
        assert (await c.delete(f"{CM}/owner")).status_code == 200  # the collector deletes the dependent now
        assert (await c.get(f"{CM}/dependent")).status_code == 404
        gate.set()
        late = await update
        assert late.status_code == 404, late.text
        assert (await c.get(f"{CM}/dependent")).status_code == 404


async def _serve_review(tmp_path, bundle, name: str):
    """An HTTPS webhook on a free port allowing everything, presenting ``bundle``'s certificate."""
    calls: list[str] = []

    async def allow(request: web.Request) -> web.Response:
        review = await request.json()
        calls.append(name)
        return web.json_response({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                  "response": {"uid": review["request"]["uid"], "allowed": True}})

    app = web.Application()
    app.router.add_post("/check", allow)
    runner = web.AppRunner(app)
    await runner.setup()
    (tmp_path / f"{name}.crt").write_bytes(bundle.chain_pem)
    (tmp_path / f"{name}.key").write_bytes(bundle.key_pem)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(tmp_path / f"{name}.crt", tmp_path / f"{name}.key")
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1], calls


def _slice(name: str, port: int, ready: bool = True) -> dict:
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": name, "namespace": "default", "labels": {"kubernetes.io/service-name": "hooks"}},
            "addressType": "IPv4", "ports": [{"name": "https", "port": port}],
            "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": ready}}]}


async def test_service_webhook_calls_a_live_endpoint(devcluster, tmp_path):
    """clientConfig.service: the Service's port -> its named port on each ready EndpointSlice
    endpoint, the certificate verified as hooks.default.svc. An endpoint that refuses the
    connection (a replica that died) is skipped for the next one; not-ready endpoints are never
    called; a Service without endpoints fails the call the way kube-apiserver words it."""
    from trainyard.security import pki

    bundle = pki.issue(["hooks.default.svc"], ca_common_name="test webhook CA")
    runner, port, calls = await _serve_review(tmp_path, bundle, "live")
    from trainyard.supervisor.ports import free_port

    dead_port = free_port()  # nothing listens there: connection refused
    try:
        async with devcluster.async_client(timeout=20) as c:
            service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "hooks", "namespace": "default"},
                       "spec": {"ports": [{"name": "https", "port": 443}]}}
            assert (await c.post("/api/v1/namespaces/default/services", json=service)).status_code == 201
            hook = {"name": "svc.example.com", "admissionReviewVersions": ["v1"], "sideEffects": "None",
                    "failurePolicy": "Fail", "timeoutSeconds": 5,
                    "clientConfig": {"service": {"name": "hooks", "namespace": "default", "path": "/check"},
                                     "caBundle": base64.b64encode(bundle.ca_bundle_pem).decode()},
                    "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                               "resources": ["configmaps"], "scope": "Namespaced"}]}
            vwc = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
                   "metadata": {"name": "svc-hooks"}, "webhooks": [hook]}
            assert (await c.post("/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
                                 json=vwc)).status_code == 201

            def cm(name: str) -> dict:
                return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}}

            none = await c.post(CM, json=cm("no-endpoints"))
            assert none.status_code == 500
            assert 'failed calling webhook "svc.example.com"' in none.json()["message"]
            assert 'no endpoints available for service "hooks"' in none.json()["message"]

            slices = "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices"
            for body in (_slice("hooks-live", port), _slice("hooks-dead", dead_port),
                         _slice("hooks-unready", dead_port, ready=False)):
                assert (await c.post(slices, json=body)).status_code == 201
            for index in range(8):  # the dead endpoint is picked first about half the time
                answer = await c.post(CM, json=cm(f"through-service-{index}"))
                assert answer.status_code == 201, answer.text
            assert calls == ["live"] * 8

            assert (await c.delete(f"{slices}/hooks-live")).status_code == 200
            refused = await c.post(CM, json=cm("only-dead"))
            assert refused.status_code == 500 and "svc.example.com" in refused.json()["message"]
    finally:
        await runner.cleanup()


async def _serve_one_review_per_connection(bundle, tmp_path) -> tuple[asyncio.AbstractServer, int, list[str]]:
    """An HTTPS webhook that answers the first review on each connection and keeps the
    connection open (HTTP/1.1 keep-alive), then closes it without an answer when the next
    request arrives on it: a server closing an idle connection just as a request crosses the
    close (uvicorn closes idle connections after 5 s), made certain instead of timed."""
    events: list[str] = []

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            for answered in range(2):
                head = await reader.readuntil(b"\r\n\r\n")
                if answered:
                    events.append("closed under a request")
                    return
                length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:"))
                review = json.loads(await reader.readexactly(length))
                body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                   "response": {"uid": review["request"]["uid"], "allowed": True}}).encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
                await writer.drain()
                events.append("answered")
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    (tmp_path / "drop.crt").write_bytes(bundle.chain_pem)
    (tmp_path / "drop.key").write_bytes(bundle.key_pem)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(tmp_path / "drop.crt", tmp_path / "drop.key")
    server = await asyncio.start_server(connection, "127.0.0.1", 0, ssl=ctx)
    return server, server.sockets[0].getsockname()[1], events


async def test_a_kept_alive_connection_closed_under_a_request_is_sent_again_on_a_new_one(devcluster, tmp_path):
    """A webhook whose only endpoint closed the pooled connection as the next review arrived
    answers that review on a new connection (Go's transport in kube-apiserver resends such a
    request): the soak saw creates fail with 'Server disconnected' / 'Can not write request
    body' from a live planner replica while its sibling was down."""
    from trainyard.security import pki

    bundle = pki.issue(["127.0.0.1"], ca_common_name="test webhook CA")
    server, port, events = await _serve_one_review_per_connection(bundle, tmp_path)
    ctx = ssl.create_default_context(cafile=str(devcluster.ca_cert))
    try:
        # One kept-alive client connection, so every create goes through one API worker: the
        # pooled webhook connection this test drops is that worker's own (each worker process
        # has its own pool; spread over 4 workers, a pooled connection may never be reused).
        async with httpx.AsyncClient(base_url=devcluster.url, verify=ctx, timeout=20,
                                     headers={"Authorization": f"Bearer {devcluster.token}"}) as c:
            hook = _hook("keepalive.example.com", f"https://127.0.0.1:{port}/check",
                         base64.b64encode(bundle.ca_bundle_pem).decode())
            vwc = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
                   "metadata": {"name": "keepalive-hooks"}, "webhooks": [hook]}
            assert (await c.post("/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
                                 json=vwc)).status_code == 201
            for index in range(4):
                answer = await c.post(CM, json={"apiVersion": "v1", "kind": "ConfigMap",
                                                "metadata": {"name": f"kept-alive-{index}"}})
                assert answer.status_code == 201, answer.text
        assert "closed under a request" in events  # the pooled connection was reused and dropped
        assert events.count("answered") == 4
    finally:
        server.close()
        await server.wait_closed()
