"""Webhook serving certificates: a CA and a serving certificate from the one CA helper
(:mod:`trainyard.security.pki`), kept in one Secret so that every planner replica serves the
same certificate, and rotated before expiry (by whichever replica notices first; the others
pick the new one up).
"""
from __future__ import annotations

import datetime as dt

from trainyard.security import pki
from trainyard.security.pki import CertBundle

CA_COMMON_NAME = "kubeflow-trainer-ca"
ORGANIZATION = "kubeflow-trainer"
SECRET_NAME = "kubeflow-trainer-webhook-cert"
KEY_CA = "ca.crt"
KEY_CA_BUNDLE = "ca-bundle.crt"
KEY_CERT = "tls.crt"
KEY_KEY = "tls.key"

__all__ = ["CertBundle", "issue", "needs_rotation", "to_secret_data", "from_secret_data", "SECRET_NAME"]


def issue(hosts: list[str], *, now: dt.datetime | None = None, previous: CertBundle | None = None,
          ca_validity: dt.timedelta = dt.timedelta(days=3650),
          cert_validity: dt.timedelta = dt.timedelta(days=365),
          rotate_within: float = 0.2) -> CertBundle:
    """A serving certificate for ``hosts``; reuses ``previous``'s CA unless that is expiring too
    (then a new CA is made and the old one stays in the bundle until it is no longer needed)."""
    return pki.issue(hosts, ca_common_name=CA_COMMON_NAME, organization=ORGANIZATION, now=now, previous=previous,
                     ca_validity=ca_validity, cert_validity=cert_validity, rotate_within=rotate_within)


needs_rotation = pki.needs_rotation


def to_secret_data(bundle: CertBundle) -> dict[str, str]:
    import base64

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode("ascii")

    return {KEY_CA: b64(bundle.ca_cert_pem), "ca.key": b64(bundle.ca_key_pem),
            KEY_CERT: b64(bundle.cert_pem), KEY_KEY: b64(bundle.key_pem),
            KEY_CA_BUNDLE: b64(bundle.ca_bundle_pem)}


def from_secret_data(data: dict[str, str]) -> CertBundle | None:
    import base64

    try:
        raw = {k: base64.b64decode(v) for k, v in (data or {}).items()}
        return CertBundle(raw[KEY_CA], raw["ca.key"], raw[KEY_CERT], raw[KEY_KEY],
                          raw.get(KEY_CA_BUNDLE, raw[KEY_CA]))
    except (KeyError, ValueError):
        return None
