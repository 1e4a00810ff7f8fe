"""Bound ServiceAccount tokens as Kubernetes issues them (TokenRequest), their OIDC discovery
documents, and their verification through those documents; pure (keys and clocks are passed in).

A token is an RS256 JWT: header ``alg``/``kid`` (the key id is the unpadded base64url SHA-256 of
the public key's DER encoding, as kube-apiserver computes it), claims ``iss``, ``sub``
(``system:serviceaccount:<ns>:<name>``), ``aud`` (a list), ``exp``/``iat``/``nbf``, ``jti`` and
``kubernetes.io`` (namespace, serviceaccount name and uid, and the bound object: pod, secret or
node, name and uid). The devcluster API server issues them; a relying party (the status endpoint
of trainer pods) verifies them with ``verify`` against the issuer's JWKS.
"""
from __future__ import annotations

import base64
import hashlib
import json
import uuid
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

MIN_EXPIRATION_SECONDS = 600
MAX_EXPIRATION_SECONDS = 1 << 32
DEFAULT_EXPIRATION_SECONDS = 3600
BOUND_KINDS = ("Pod", "Secret", "Node")
JWKS_PATH = "/openid/v1/jwks"
DISCOVERY_PATH = "/.well-known/openid-configuration"
# Clock skew tolerated on exp/nbf when verifying, as Kubernetes' own authenticator.
LEEWAY_SECONDS = 60


class TokenError(Exception):
    """A token that is malformed, badly signed, expired, or not meant for this audience."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _json_b64(value: dict[str, Any]) -> str:
    return _b64(json.dumps(value, separators=(",", ":"), sort_keys=True).encode())


def _uint(value: int) -> str:
    return _b64(value.to_bytes((value.bit_length() + 7) // 8 or 1, "big"))


@dataclass(frozen=True)
class SigningKey:
    """The issuer's RSA key and its key id."""

    private_key: rsa.RSAPrivateKey
    kid: str

    @staticmethod
    def generate() -> "SigningKey":
        return SigningKey.of(rsa.generate_private_key(public_exponent=65537, key_size=2048))

    @staticmethod
    def of(private_key: rsa.RSAPrivateKey) -> "SigningKey":
        der = private_key.public_key().public_bytes(serialization.Encoding.DER,
                                                    serialization.PublicFormat.SubjectPublicKeyInfo)
        return SigningKey(private_key, _b64(hashlib.sha256(der).digest()))

    @staticmethod
    def from_pem(pem: bytes) -> "SigningKey":
        key = serialization.load_pem_private_key(pem, password=None)
        if not isinstance(key, rsa.RSAPrivateKey):
            raise ValueError("the ServiceAccount signing key must be an RSA key")
        return SigningKey.of(key)

    def to_pem(self) -> bytes:
        return self.private_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                              serialization.NoEncryption())

    def jwk(self) -> dict[str, str]:
        numbers = self.private_key.public_key().public_numbers()
        return {"use": "sig", "kty": "RSA", "kid": self.kid, "alg": "RS256", "n": _uint(numbers.n), "e": _uint(numbers.e)}


@dataclass(frozen=True)
class BoundObject:
    kind: str
    name: str
    uid: str


def request_errors(spec: dict[str, Any]) -> list[tuple[str, str]]:
    """Field errors of a TokenRequest spec as ``(field, message)``; Kubernetes' wording."""
    errors: list[tuple[str, str]] = []
    seconds = spec.get("expirationSeconds", DEFAULT_EXPIRATION_SECONDS)
    if not isinstance(seconds, int) or isinstance(seconds, bool):
        errors.append(("spec.expirationSeconds", f"Invalid value: {json.dumps(seconds)}: must be an integer"))
    elif seconds < MIN_EXPIRATION_SECONDS:
        errors.append(("spec.expirationSeconds", f"Invalid value: {seconds}: may not specify a duration less than 10 minutes"))
    elif seconds > MAX_EXPIRATION_SECONDS:
        errors.append(("spec.expirationSeconds", f"Invalid value: {seconds}: may not specify a duration larger than 2^32 seconds"))
    audiences = spec.get("audiences")
    if audiences is not None and (not isinstance(audiences, list) or not all(isinstance(a, str) for a in audiences)):
        errors.append(("spec.audiences", "Invalid value: must be a list of strings"))
    ref = spec.get("boundObjectRef")
    if ref is not None:
        kind = ref.get("kind") if isinstance(ref, dict) else None
        if kind not in BOUND_KINDS:
            supported = ", ".join(json.dumps(k) for k in BOUND_KINDS)
            errors.append(("spec.boundObjectRef.kind", f"Unsupported value: {json.dumps(kind)}: supported values: {supported}"))
        elif not ref.get("name"):
            errors.append(("spec.boundObjectRef.name", "Required value"))
    return errors


def issue(key: SigningKey, *, issuer: str, namespace: str, service_account: str, service_account_uid: str,
          audiences: list[str], expiration_seconds: int, now: int, bound: BoundObject | None = None,
          token_id: str | None = None) -> str:
    """A signed token for the ServiceAccount, valid from ``now`` (Unix seconds)."""
    private: dict[str, Any] = {"namespace": namespace,
                               "serviceaccount": {"name": service_account, "uid": service_account_uid}}
    if bound is not None:
        private[bound.kind.lower()] = {"name": bound.name, "uid": bound.uid}
    claims = {
        "aud": list(audiences), "exp": now + expiration_seconds, "iat": now, "nbf": now, "iss": issuer,
        "jti": token_id or str(uuid.uuid4()), "kubernetes.io": private,
        "sub": f"system:serviceaccount:{namespace}:{service_account}",
    }
    signing_input = f"{_json_b64({'alg': 'RS256', 'kid': key.kid})}.{_json_b64(claims)}"
    signature = key.private_key.sign(signing_input.encode("ascii"), padding.PKCS1v15(), hashes.SHA256())
    return f"{signing_input}.{_b64(signature)}"


def openid_configuration(issuer: str) -> dict[str, Any]:
    """The issuer's discovery document (``/.well-known/openid-configuration``)."""
    return {"issuer": issuer, "jwks_uri": issuer.rstrip("/") + JWKS_PATH, "response_types_supported": ["id_token"],
            "subject_types_supported": ["public"], "id_token_signing_alg_values_supported": ["RS256"]}


def jwks(keys: list[SigningKey]) -> dict[str, Any]:
    """The issuer's public keys (``/openid/v1/jwks``)."""
    return {"keys": [k.jwk() for k in keys]}


def _public_key(jwk: dict[str, Any]) -> rsa.RSAPublicKey:
    if jwk.get("kty") != "RSA":
        raise TokenError(f"unsupported key type {jwk.get('kty')!r}")
    n, e = (int.from_bytes(_unb64(str(jwk[part])), "big") for part in ("n", "e"))
    return rsa.RSAPublicNumbers(e, n).public_key()


def unverified_header(token: str) -> dict[str, Any]:
    """The header of a token without checking anything (its ``kid``, to pick the key)."""
    try:
        header = json.loads(_unb64(token.split(".")[0]))
    except (IndexError, ValueError) as err:
        raise TokenError("malformed token") from err
    if not isinstance(header, dict):
        raise TokenError("malformed token")
    return header


def unverified_claims(token: str) -> dict[str, Any]:
    """The claims of a token without checking anything (to find its issuer first)."""
    try:
        claims = json.loads(_unb64(token.split(".")[1]))
    except (IndexError, ValueError) as err:
        raise TokenError("malformed token") from err
    if not isinstance(claims, dict):
        raise TokenError("malformed token")
    return claims


def verify(token: str, key_set: dict[str, Any], *, issuer: str, audience: str, now: int) -> dict[str, Any]:
    """The claims of ``token`` once its signature (a key of ``key_set``, a JWKS), issuer,
    audience and validity window check out; ``TokenError`` says which did not."""
    parts = token.split(".")
    if len(parts) != 3:
        raise TokenError("malformed token")
    try:
        header = json.loads(_unb64(parts[0]))
        signature = _unb64(parts[2])
    except ValueError as err:
        raise TokenError("malformed token") from err
    if not isinstance(header, dict) or header.get("alg") != "RS256":
        raise TokenError("unsupported signing algorithm")
    candidates = [k for k in key_set.get("keys") or [] if isinstance(k, dict) and k.get("kid") == header.get("kid")]
    if not candidates:
        raise TokenError("unknown signing key")
    try:
        _public_key(candidates[0]).verify(signature, f"{parts[0]}.{parts[1]}".encode("ascii"), padding.PKCS1v15(),
                                          hashes.SHA256())
    except (InvalidSignature, ValueError) as err:
        raise TokenError("invalid signature") from err
    claims = unverified_claims(token)
    if claims.get("iss") != issuer:
        raise TokenError("unexpected issuer")
    audiences = claims.get("aud")
    if audience not in (audiences if isinstance(audiences, list) else [audiences]):
        raise TokenError("token not meant for this audience")
    if not isinstance(claims.get("exp"), int) or now > claims["exp"] + LEEWAY_SECONDS:
        raise TokenError("token expired")
    if isinstance(claims.get("nbf"), int) and now < claims["nbf"] - LEEWAY_SECONDS:
        raise TokenError("token not valid yet")
    return claims
