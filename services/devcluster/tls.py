"""The devcluster's self-signed CA, serving certificate and bearer token (kept in the data dir)."""
from __future__ import annotations

import datetime
import ipaddress
import os
import secrets
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Credentials:
    ca_cert: Path
    server_cert: Path
    server_key: Path
    token: str


def _write_private(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    os.chmod(path, 0o600)


def ensure_credentials(data_dir: Path) -> Credentials:
    """Create the CA, server certificate (localhost, 127.0.0.1) and token once; reuse them after."""
    pki = data_dir / "pki"
    pki.mkdir(parents=True, exist_ok=True)
    ca_cert, server_cert, server_key, token_file = pki / "ca.crt", pki / "server.crt", pki / "server.key", pki / "token"
    if not (ca_cert.exists() and server_cert.exists() and server_key.exists() and token_file.exists()):
        _generate(ca_cert, server_cert, server_key)
        _write_private(token_file, secrets.token_urlsafe(32).encode())
    return Credentials(ca_cert, server_cert, server_key, token_file.read_text().strip())


def _generate(ca_cert: Path, server_cert: Path, server_key: Path) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "trainyard-devcluster-ca")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=3650))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                                       key_encipherment=False, data_encipherment=False, key_agreement=False,
                                       encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "trainyard-devcluster")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=3650))
            .add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"), x509.DNSName("kubernetes"), x509.DNSName("kubernetes.default"),
                x509.DNSName("kubernetes.default.svc"), x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                x509.IPAddress(ipaddress.ip_address("::1"))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    ca_cert.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    server_cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM) + ca.public_bytes(serialization.Encoding.PEM))
    _write_private(server_key, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                 serialization.NoEncryption()))


def kubeconfig_text(url: str, credentials: Credentials, namespace: str = "default") -> str:
    import base64
    ca_data = base64.b64encode(credentials.ca_cert.read_bytes()).decode()
    return (
        "apiVersion: v1\n"
        "kind: Config\n"
        "clusters:\n"
        "- name: devcluster\n"
        "  cluster:\n"
        f"    server: {url}\n"
        f"    certificate-authority-data: {ca_data}\n"
        "users:\n"
        "- name: devcluster-admin\n"
        "  user:\n"
        f"    token: {credentials.token}\n"
        "contexts:\n"
        "- name: devcluster\n"
        "  context:\n"
        "    cluster: devcluster\n"
        "    user: devcluster-admin\n"
        f"    namespace: {namespace}\n"
        "current-context: devcluster\n"
    )
