"""Webhook serving certificates: a CA and a serving certificate made with `cryptography`,
kept in one Secret so that every planner replica serves the same certificate, and rotated
before expiry (by whichever replica notices first; the others pick the new one up).
"""
from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

CA_COMMON_NAME = "kubeflow-trainer-ca"
ORGANIZATION = "kubeflow-trainer"
SECRET_NAME = "kubeflow-trainer-webhook-cert"
KEY_CA = "ca.crt"
KEY_CA_BUNDLE = "ca-bundle.crt"
KEY_CERT = "tls.crt"
KEY_KEY = "tls.key"


@dataclass(frozen=True)
class CertBundle:
    ca_cert_pem: bytes
    ca_key_pem: bytes
    cert_pem: bytes
    key_pem: bytes
    ca_bundle_pem: bytes  # the CAs clients should trust (the current one, plus the previous while rotating)

    @property
    def not_after(self) -> dt.datetime:
        return x509.load_pem_x509_certificate(self.cert_pem).not_valid_after_utc

    @property
    def not_before(self) -> dt.datetime:
        return x509.load_pem_x509_certificate(self.cert_pem).not_valid_before_utc

    @property
    def ca_not_after(self) -> dt.datetime:
        return x509.load_pem_x509_certificate(self.ca_cert_pem).not_valid_after_utc

    def names(self) -> list[str]:
        cert = x509.load_pem_x509_certificate(self.cert_pem)
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        return [str(v) for v in san.get_values_for_type(x509.DNSName)] + [
            str(v) for v in san.get_values_for_type(x509.IPAddress)]


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _new_ca(now: dt.datetime, validity: dt.timedelta) -> tuple[bytes, bytes]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, CA_COMMON_NAME),
                      x509.NameAttribute(NameOID.ORGANIZATION_NAME, ORGANIZATION)])
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + validity)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)


def _new_serving_cert(ca_cert_pem: bytes, ca_key_pem: bytes, hosts: list[str], now: dt.datetime,
                      validity: dt.timedelta) -> tuple[bytes, bytes]:
    ca_cert = x509.load_pem_x509_certificate(ca_cert_pem)
    ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
    key = ec.generate_private_key(ec.SECP256R1())
    alt_names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            alt_names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            alt_names.append(x509.DNSName(host))
    not_after = min(now + validity, ca_cert.not_valid_after_utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0]),
                                 x509.NameAttribute(NameOID.ORGANIZATION_NAME, ORGANIZATION)]))
        .issuer_name(ca_cert.subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(not_after)
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)


def issue(hosts: list[str], *, now: dt.datetime | None = None, previous: CertBundle | None = None,
          ca_validity: dt.timedelta = dt.timedelta(days=3650),
          cert_validity: dt.timedelta = dt.timedelta(days=365),
          rotate_within: float = 0.2) -> CertBundle:
    """A serving certificate for ``hosts``; reuses ``previous``'s CA unless that is expiring too
    (then a new CA is made and the old one stays in the bundle until it is no longer needed)."""
    now = now or dt.datetime.now(dt.timezone.utc)
    ca_cert, ca_key, bundle = None, None, b""
    if previous is not None and not _expiring(
            x509.load_pem_x509_certificate(previous.ca_cert_pem), now, rotate_within):
        ca_cert, ca_key = previous.ca_cert_pem, previous.ca_key_pem
        bundle = previous.ca_cert_pem
    if ca_cert is None:
        ca_cert, ca_key = _new_ca(now, ca_validity)
        bundle = ca_cert + (previous.ca_cert_pem if previous is not None else b"")
    cert, key = _new_serving_cert(ca_cert, ca_key, hosts, now, cert_validity)
    return CertBundle(ca_cert, ca_key, cert, key, bundle)


def _expiring(cert: x509.Certificate, now: dt.datetime, rotate_within: float) -> bool:
    lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
    return now >= cert.not_valid_after_utc - lifetime * rotate_within


def needs_rotation(bundle: CertBundle, hosts: list[str], *, now: dt.datetime | None = None,
                   rotate_within: float = 0.2) -> bool:
    """True when the serving cert (or its CA) is in the last ``rotate_within`` of its lifetime,
    or does not cover ``hosts``."""
    now = now or dt.datetime.now(dt.timezone.utc)
    cert = x509.load_pem_x509_certificate(bundle.cert_pem)
    ca = x509.load_pem_x509_certificate(bundle.ca_cert_pem)
    return _expiring(cert, now, rotate_within) or _expiring(ca, now, rotate_within) \
        or not set(hosts) <= set(bundle.names())


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
