"""Bound ServiceAccount tokens: issued, published (OIDC discovery, JWKS) and verified as
Kubernetes does; every check of ``verify`` refuses what it must."""
from __future__ import annotations

import base64
import hashlib
import json

import pytest
from cryptography.hazmat.primitives import serialization

from trainyard.apimachinery import serviceaccount_tokens as t

ISSUER = "https://127.0.0.1:6443"
NOW = 1_800_000_000


@pytest.fixture(scope="module")
def key() -> t.SigningKey:
    return t.SigningKey.generate()


def token(key: t.SigningKey, **overrides) -> str:
    args = dict(issuer=ISSUER, namespace="team", service_account="trainer", service_account_uid="sa-uid",
                audiences=["trainer.kubeflow.org/team/job"], expiration_seconds=3600, now=NOW,
                bound=t.BoundObject("Pod", "job-node-0-0", "pod-uid"), token_id="jti-1")
    args.update(overrides)
    return t.issue(key, **args)


def test_claims_and_header_are_kubernetes_shaped(key: t.SigningKey) -> None:
    issued = token(key)
    header = json.loads(base64.urlsafe_b64decode(issued.split(".")[0] + "=="))
    der = key.private_key.public_key().public_bytes(serialization.Encoding.DER,
                                                   serialization.PublicFormat.SubjectPublicKeyInfo)
    assert header == {"alg": "RS256", "kid": base64.urlsafe_b64encode(hashlib.sha256(der).digest()).rstrip(b"=").decode()}
    claims = t.verify(issued, t.jwks([key]), issuer=ISSUER, audience="trainer.kubeflow.org/team/job", now=NOW + 10)
    assert claims == {
        "aud": ["trainer.kubeflow.org/team/job"], "exp": NOW + 3600, "iat": NOW, "nbf": NOW, "iss": ISSUER,
        "jti": "jti-1", "sub": "system:serviceaccount:team:trainer",
        "kubernetes.io": {"namespace": "team", "serviceaccount": {"name": "trainer", "uid": "sa-uid"},
                          "pod": {"name": "job-node-0-0", "uid": "pod-uid"}},
    }


def test_discovery_points_at_the_key_set(key: t.SigningKey) -> None:
    assert t.openid_configuration(ISSUER)["jwks_uri"] == ISSUER + "/openid/v1/jwks"
    assert t.openid_configuration(ISSUER)["issuer"] == ISSUER
    [jwk] = t.jwks([key])["keys"]
    assert jwk["kid"] == key.kid and jwk["alg"] == "RS256" and jwk["use"] == "sig" and "d" not in jwk


def test_a_key_survives_pem_round_trips(key: t.SigningKey) -> None:
    assert t.SigningKey.from_pem(key.to_pem()).kid == key.kid


@pytest.mark.parametrize("change, error", [
    pytest.param({"audience": "trainer.kubeflow.org/team/other"}, "audience", id="other-audience"),
    pytest.param({"issuer": "https://elsewhere"}, "issuer", id="other-issuer"),
    pytest.param({"now": NOW + 3600 + t.LEEWAY_SECONDS + 1}, "expired", id="expired"),
    pytest.param({"now": NOW - t.LEEWAY_SECONDS - 1}, "not valid yet", id="not-yet"),
])
def test_verify_refuses(key: t.SigningKey, change: dict, error: str) -> None:
    args = dict(issuer=ISSUER, audience="trainer.kubeflow.org/team/job", now=NOW)
    args.update(change)
    with pytest.raises(t.TokenError, match=error):
        t.verify(token(key), t.jwks([key]), **args)


def test_verify_refuses_forged_and_foreign_tokens(key: t.SigningKey) -> None:
    args = dict(issuer=ISSUER, audience="trainer.kubeflow.org/team/job", now=NOW)
    header, claims, signature = token(key).split(".")
    forged_claims = t.unverified_claims(token(key))
    forged_claims["kubernetes.io"]["namespace"] = "other"
    forged = ".".join([header, base64.urlsafe_b64encode(json.dumps(forged_claims).encode()).rstrip(b"=").decode(),
                       signature])
    with pytest.raises(t.TokenError, match="signature"):
        t.verify(forged, t.jwks([key]), **args)
    with pytest.raises(t.TokenError, match="unknown signing key"):
        t.verify(token(t.SigningKey.generate()), t.jwks([key]), **args)
    with pytest.raises(t.TokenError, match="malformed"):
        t.verify("not-a-token", t.jwks([key]), **args)


@pytest.mark.parametrize("spec, errors", [
    ({}, []),
    ({"expirationSeconds": 600, "audiences": ["a"], "boundObjectRef": {"kind": "Pod", "name": "p"}}, []),
    ({"expirationSeconds": 599},
     [("spec.expirationSeconds", "Invalid value: 599: may not specify a duration less than 10 minutes")]),
    ({"expirationSeconds": (1 << 32) + 1},
     [("spec.expirationSeconds", f"Invalid value: {(1 << 32) + 1}: may not specify a duration larger than 2^32 seconds")]),
    ({"boundObjectRef": {"kind": "ConfigMap", "name": "c"}},
     [("spec.boundObjectRef.kind", 'Unsupported value: "ConfigMap": supported values: "Pod", "Secret", "Node"')]),
])
def test_token_request_validation(spec: dict, errors: list) -> None:
    assert t.request_errors(spec) == errors
