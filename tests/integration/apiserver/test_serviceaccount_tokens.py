"""Bound ServiceAccount tokens from a real devcluster: ``kubectl create token`` (the TokenRequest
subresource), verified as a relying party does, through the issuer's OIDC discovery and JWKS
fetched without credentials."""
from __future__ import annotations

import json
import time

import httpx
import pytest

from trainyard.apimachinery import serviceaccount_tokens as sat

POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "holder", "namespace": "default"},
       "spec": {"nodeName": "nowhere", "containers": [{"name": "c", "image": "busybox"}]}}


@pytest.fixture(scope="module")
def cluster(devcluster_module):
    devcluster_module.kubectl("create", "serviceaccount", "trainer")
    return devcluster_module


def anonymous(cluster) -> httpx.Client:
    return cluster.client(token=None, timeout=10)


def relying_party_verify(cluster, token: str, audience: str) -> dict:
    """What a relying party does: the issuer from the token, its discovery, its keys."""
    issuer = sat.unverified_claims(token)["iss"]
    assert issuer == cluster.url
    with anonymous(cluster) as http:
        discovery = http.get("/.well-known/openid-configuration").raise_for_status().json()
        keys = http.get(discovery["jwks_uri"].removeprefix(cluster.url)).raise_for_status().json()
    return sat.verify(token, keys, issuer=discovery["issuer"], audience=audience, now=int(time.time()))


def test_kubectl_create_token_is_verifiable_through_oidc_discovery(cluster) -> None:
    token = cluster.kubectl("create", "token", "trainer", "--audience", "trainer.kubeflow.org/default/job",
                            "--duration", "10m").stdout.strip()
    claims = relying_party_verify(cluster, token, "trainer.kubeflow.org/default/job")
    account = json.loads(cluster.kubectl("get", "sa", "trainer", "-o", "json").stdout)
    assert claims["sub"] == "system:serviceaccount:default:trainer"
    assert claims["kubernetes.io"] == {"namespace": "default",
                                       "serviceaccount": {"name": "trainer", "uid": account["metadata"]["uid"]}}
    assert claims["exp"] - claims["iat"] == 600
    with pytest.raises(sat.TokenError, match="audience"):
        relying_party_verify(cluster, token, "trainer.kubeflow.org/default/other")


def test_a_token_bound_to_a_pod_names_it(cluster) -> None:
    cluster.kubectl("create", "-f", "-", input=json.dumps(POD))
    pod = json.loads(cluster.kubectl("get", "pod", "holder", "-o", "json").stdout)
    token = cluster.kubectl("create", "token", "trainer", "--bound-object-kind", "Pod", "--bound-object-name", "holder",
                            "--bound-object-uid", pod["metadata"]["uid"]).stdout.strip()
    claims = relying_party_verify(cluster, token, cluster.url)  # no audience asked: the issuer's own
    assert claims["kubernetes.io"]["pod"] == {"name": "holder", "uid": pod["metadata"]["uid"]}
    assert claims["exp"] - claims["iat"] == 3600


def test_refusals_are_the_api_servers(cluster) -> None:
    missing = cluster.kubectl("create", "token", "ghost", check=False)
    assert missing.returncode != 0 and 'serviceaccounts "ghost" not found' in missing.stderr
    short = cluster.kubectl("create", "token", "trainer", "--duration", "5m", check=False)
    assert short.returncode != 0 and "may not specify a duration less than 10 minutes" in short.stderr
    unbound = cluster.kubectl("create", "token", "trainer", "--bound-object-kind", "Pod", "--bound-object-name", "gone",
                              check=False)
    assert unbound.returncode != 0 and 'pods "gone" not found' in unbound.stderr


def test_discovery_documents_need_no_credentials_and_the_api_still_does(cluster) -> None:
    with anonymous(cluster) as http:
        discovery = http.get("/.well-known/openid-configuration")
        keys = http.get("/openid/v1/jwks")
        assert discovery.status_code == 200 and keys.status_code == 200
        assert keys.headers["Content-Type"].startswith("application/jwk-set+json")
        assert [k["kty"] for k in keys.json()["keys"]] == ["RSA"] and "d" not in keys.json()["keys"][0]
        assert http.get("/api/v1/namespaces/default/serviceaccounts").status_code == 401
