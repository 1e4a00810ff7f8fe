"""The one certificate authority helper: every TLS certificate trainyard makes comes from here
(the planner's admission webhook, devcluster's API server, the data plane's pod webhook, the
NATS client port). ECDSA P-256 keys, SHA-256 signatures, made with ``cryptography``.

A :class:`CertBundle` is a CA plus one serving certificate; :func:`issue` makes one and, given
the previous bundle, rotates it: the CA is kept unless it is in the last fifth of its life
(then a new one is made and the old CA stays in ``ca_bundle_pem`` so clients that trust either
keep working through the switch). :func:`needs_rotation` tells when to call it again.
"""
from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

ORGANIZATION = "trainyard"


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
    def chain_pem(self) -> bytes:
        """The serving certificate followed by its CA (what a server presents)."""
        return self.cert_pem + self.ca_cert_pem

    def names(self) -> list[str]:
        cert = x509.load_pem_x509_certificate(self.cert_pem)
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        return [str(v) for v in san.get_values_for_type(x509.DNSName)] + [
            str(v) for v in san.get_values_for_type(x509.IPAddress)]


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _name(common_name: str, organization: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name),
                      x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization)])


def new_ca(common_name: str, *, organization: str = ORGANIZATION, now: dt.datetime | None = None,
           validity: dt.timedelta = dt.timedelta(days=3650)) -> tuple[bytes, bytes]:
    """(CA certificate PEM, CA key PEM): a self-signed CA that signs leaf certificates only."""
    now = now or dt.datetime.now(dt.timezone.utc)
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name(common_name, organization)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + validity)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem(key)


def new_serving_cert(ca_cert_pem: bytes, ca_key_pem: bytes, hosts: list[str], *,
                     organization: str = ORGANIZATION, now: dt.datetime | None = None,
                     validity: dt.timedelta = dt.timedelta(days=365),
                     common_name: str | None = None, client_auth: bool = False) -> tuple[bytes, bytes]:
    """(certificate PEM, key PEM) for ``hosts`` (DNS names or IP addresses), signed by the CA;
    never valid past the CA. ``client_auth``: also a client certificate (mutual TLS between
    peers, e.g. NATS routes)."""
    now = now or dt.datetime.now(dt.timezone.utc)
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
        .subject_name(_name(common_name or hosts[0], organization))
        .issuer_name(ca_cert.subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(not_after)
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]
                                             + ([ExtendedKeyUsageOID.CLIENT_AUTH] if client_auth else [])),
                       critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),  # type: ignore[arg-type]
                       critical=False)
        .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem(key)


def issue(hosts: list[str], *, ca_common_name: str, organization: str = ORGANIZATION,
          now: dt.datetime | None = None, previous: CertBundle | None = None,
          ca_validity: dt.timedelta = dt.timedelta(days=3650),
          cert_validity: dt.timedelta = dt.timedelta(days=365),
          rotate_within: float = 0.2, common_name: str | None = None) -> CertBundle:
    """A serving certificate for ``hosts``; reuses ``previous``'s CA unless that is expiring too
    (then a new CA is made and the old one stays in the bundle until it is no longer needed)."""
    now = now or dt.datetime.now(dt.timezone.utc)
    ca_cert, ca_key, bundle = None, None, b""
    if previous is not None and not expiring(
            x509.load_pem_x509_certificate(previous.ca_cert_pem), now, rotate_within):
        ca_cert, ca_key = previous.ca_cert_pem, previous.ca_key_pem
        bundle = previous.ca_cert_pem
    if ca_cert is None or ca_key is None:
        ca_cert, ca_key = new_ca(ca_common_name, organization=organization, now=now, validity=ca_validity)
        bundle = ca_cert + (previous.ca_cert_pem if previous is not None else b"")
    cert, key = new_serving_cert(ca_cert, ca_key, hosts, organization=organization, now=now,
                                 validity=cert_validity, common_name=common_name)
    return CertBundle(ca_cert, ca_key, cert, key, bundle)


def expiring(cert: x509.Certificate, now: dt.datetime, rotate_within: float) -> bool:
    lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
    return now >= cert.not_valid_after_utc - lifetime * rotate_within


def needs_rotation(bundle: CertBundle, hosts: list[str], *, now: dt.datetime | None = None,
                   rotate_within: float = 0.2) -> bool:
    """True when the serving cert (or its CA) is in the last ``rotate_within`` of its lifetime,
    or does not cover ``hosts``."""
    now = now or dt.datetime.now(dt.timezone.utc)
    cert = x509.load_pem_x509_certificate(bundle.cert_pem)
    ca = x509.load_pem_x509_certificate(bundle.ca_cert_pem)
    return expiring(cert, now, rotate_within) or expiring(ca, now, rotate_within) \
        or not set(hosts) <= set(bundle.names())


def write_private(path: Path, data: bytes) -> None:
    """Writes ``data`` to a file only its owner can read (created 0600, never world-readable)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.chmod(path, 0o600)


def save_bundle(directory: Path, bundle: CertBundle) -> None:
    """ca.crt, ca.key, tls.crt (chain), tls.key and ca-bundle.crt in ``directory`` (all 0600)."""
    for name, data in (("ca.crt", bundle.ca_cert_pem), ("ca.key", bundle.ca_key_pem),
                       ("tls.crt", bundle.chain_pem), ("tls.key", bundle.key_pem),
                       ("ca-bundle.crt", bundle.ca_bundle_pem)):
        write_private(directory / name, data)


def load_bundle(directory: Path) -> CertBundle | None:
    try:
        chain = (directory / "tls.crt").read_bytes()
        ca = (directory / "ca.crt").read_bytes()
        cert = chain[: len(chain) - len(ca)] if chain.endswith(ca) else chain
        return CertBundle(ca, (directory / "ca.key").read_bytes(), cert, (directory / "tls.key").read_bytes(),
                          (directory / "ca-bundle.crt").read_bytes())
    except OSError:
        return None


def ensure_bundle(directory: Path, hosts: list[str], *, ca_common_name: str) -> tuple[CertBundle, bool]:
    """The bundle kept in ``directory``, made or rotated when needed; (bundle, whether it changed)."""
    current = load_bundle(directory)
    if current is not None and not needs_rotation(current, hosts):
        return current, False
    bundle = issue(hosts, ca_common_name=ca_common_name, previous=current)
    save_bundle(directory, bundle)
    return bundle, True
