"""Projected ServiceAccount tokens in pods (what trainer pods use to report progress): the data
plane requests a token bound to the pod from the API server, mounts it with the other projected
sources, and a relying party verifies it through the issuer's OIDC discovery and JWKS."""
from __future__ import annotations

import ssl
import time

import httpx

from fixtures.dataplane import wait_until
from trainyard.apimachinery import serviceaccount_tokens as sat
from trainyard.kube.resources import Resource

POD = Resource("", "v1", "pods", "Pod")
CONFIGMAP = Resource("", "v1", "configmaps", "ConfigMap")
SERVICEACCOUNT = Resource("", "v1", "serviceaccounts", "ServiceAccount")
MOUNT = "/var/run/secrets/trainyard-test"


def token_pod(name: str, ns: str, audience: str, account: str | None = None) -> dict:
    volume = {"name": "status-token", "projected": {"sources": [
        {"serviceAccountToken": {"audience": audience, "expirationSeconds": 600, "path": "token"}},
        {"configMap": {"name": "status-ca", "items": [{"key": "ca.crt", "path": "ca.crt"}]}}]}}
    container = {"name": "c", "image": "local", "command": ["sh", "-c", f"cat {MOUNT}/token; echo; cat {MOUNT}/ca.crt"],
                 "volumeMounts": [{"name": "status-token", "mountPath": MOUNT, "readOnly": True}]}
    spec = {"restartPolicy": "Never", "containers": [container], "volumes": [volume]}
    if account:
        spec["serviceAccountName"] = account
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns}, "spec": spec}


async def test_a_pod_gets_a_token_bound_to_it_for_its_service_account(dataplane_cluster, kube, ns) -> None:
    server = dataplane_cluster.server
    audience = f"trainer.kubeflow.org/{ns}/job"
    await kube.create(CONFIGMAP, ns, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "status-ca"},
                                      "data": {"ca.crt": "not-a-real-ca"}})
    account = await wait_until(lambda: kube.get(SERVICEACCOUNT, ns, "default"), what="the default ServiceAccount")
    created = await kube.create(POD, ns, token_pod("reader", ns, audience))

    async def succeeded():
        pod = await kube.get(POD, ns, "reader")
        return pod if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed") else None
    pod = await wait_until(succeeded, timeout=60, what="the pod to finish")
    assert pod["status"]["phase"] == "Succeeded"
    token, ca = server.kubectl("logs", "-n", ns, "reader").stdout.split("\n")[:2]
    assert ca == "not-a-real-ca"

    with httpx.Client(base_url=server.url, verify=ssl.create_default_context(cafile=str(server.ca_cert)),
                      timeout=10) as http:
        discovery = http.get("/.well-known/openid-configuration").raise_for_status().json()
        keys = http.get("/openid/v1/jwks").raise_for_status().json()
    claims = sat.verify(token, keys, issuer=discovery["issuer"], audience=audience, now=int(time.time()))
    assert claims["sub"] == f"system:serviceaccount:{ns}:default"
    assert claims["kubernetes.io"]["serviceaccount"] == {"name": "default", "uid": account["metadata"]["uid"]}
    assert claims["kubernetes.io"]["pod"] == {"name": "reader", "uid": created["metadata"]["uid"]}
    assert claims["exp"] - claims["iat"] == 600


async def test_a_pod_of_a_missing_service_account_waits(dataplane_cluster, kube, ns) -> None:
    await kube.create(CONFIGMAP, ns, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "status-ca"},
                                      "data": {"ca.crt": "x"}})
    await kube.create(POD, ns, token_pod("orphan", ns, "aud", account="ghost"))

    async def waiting():
        pod = await kube.get(POD, ns, "orphan")
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            message = ((status.get("state") or {}).get("waiting") or {}).get("message") or ""
            if "failed to fetch token" in message:
                return message
        return None
    message = await wait_until(waiting, timeout=30, what="the token failure")
    assert 'serviceaccounts "ghost" not found' in message
    assert (await kube.get(POD, ns, "orphan"))["status"]["phase"] == "Pending"
    await kube.request("DELETE", POD.path(ns, "orphan"))
