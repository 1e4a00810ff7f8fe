"""The devcluster's self-signed CA, serving certificate and bearer token (kept in the data dir)."""
from __future__ import annotations

import base64
import datetime
import secrets
from dataclasses import dataclass
from pathlib import Path

from trainyard.security import pki
from trainyard.security.pki import write_private

from .storage.datadir import PKI_NAME


@dataclass(frozen=True)
class Credentials:
    ca_cert: Path
    server_cert: Path
    server_key: Path
    token: str


def _write_private(path: Path, data: bytes) -> None:

    write_private(path, data)


def ensure_credentials(data_dir: Path) -> Credentials:
    """Create the CA, server certificate (localhost, 127.0.0.1) and token once; reuse them after."""
    pki = data_dir / PKI_NAME
    pki.mkdir(parents=True, exist_ok=True)
    ca_cert, server_cert, server_key, token_file = pki / "ca.crt", pki / "server.crt", pki / "server.key", pki / "token"
    if not (ca_cert.exists() and server_cert.exists() and server_key.exists() and token_file.exists()):
        _generate(ca_cert, server_cert, server_key)
        _write_private(token_file, secrets.token_urlsafe(32).encode())
    return Credentials(ca_cert, server_cert, server_key, token_file.read_text().strip())


SERVING_HOSTS = ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "127.0.0.1", "::1"]


def _generate(ca_cert: Path, server_cert: Path, server_key: Path) -> None:
    """The CA and serving certificate, from the one CA helper (trainyard.security.pki)."""
    validity = datetime.timedelta(days=3650)
    ca_pem, ca_key_pem = pki.new_ca("trainyard-devcluster-ca", validity=validity)
    cert_pem, key_pem = pki.new_serving_cert(ca_pem, ca_key_pem, SERVING_HOSTS, validity=validity,
                                             common_name="trainyard-devcluster")
    ca_cert.write_bytes(ca_pem)
    server_cert.write_bytes(cert_pem + ca_pem)
    _write_private(server_key, key_pem)


def kubeconfig_text(url: str, credentials: Credentials, namespace: str = "default") -> str:
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
