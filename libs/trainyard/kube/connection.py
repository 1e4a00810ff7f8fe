"""How to reach one API server: its address, the TLS that trusts it (and the client certificate
shown to it), and the credential each request carries. Built from a resolved kubeconfig
(:mod:`trainyard.kube.kubeconfig`), for :class:`trainyard.kube.client.KubeClient`.

Certificates, bearer tokens (inline, ``tokenFile``, the in-cluster ServiceAccount token) and
basic auth are plain data and go straight onto aiohttp. Credential plugins (``exec``,
``auth-provider``) are code that kubernetes-asyncio implements (running the plugin, caching its
answer until it expires, refreshing it), so a user with one is handed to that library. It is
imported only then: its package imports every generated API model and a schema validator, about
one second of CPU in every process that touched it, most of a service's start.
"""
from __future__ import annotations

import base64
import binascii
import os
import ssl
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from trainyard.kube.kubeconfig import KubeconfigError, ResolvedKubeconfig

IN_CLUSTER_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# client-go re-reads a token file at most once a minute: a projected ServiceAccount token is
# rotated by the kubelet well before it expires, and the new one is picked up within this.
TOKEN_REREAD_S = 60.0


class Credential(Protocol):
    async def headers(self) -> dict[str, str]:
        """The headers that authenticate one request (may refresh what they carry)."""


@dataclass(frozen=True)
class Anonymous:
    async def headers(self) -> dict[str, str]:
        return {}


@dataclass(frozen=True)
class BearerToken:
    token: str

    async def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


@dataclass
class BasicAuth:
    username: str
    password: str

    async def headers(self) -> dict[str, str]:
        pair = f"{self.username}:{self.password}".encode()
        return {"Authorization": "Basic " + base64.b64encode(pair).decode()}


@dataclass
class TokenFile:
    """A token read from a file and read again every ``reread_s`` (rotated tokens)."""

    path: Path
    reread_s: float = TOKEN_REREAD_S
    _token: str = field(default="", repr=False)
    _read_at: float = field(default=float("-inf"), repr=False)

    def read(self) -> str:
        now = time.monotonic()
        if now - self._read_at >= self.reread_s or not self._token:
            try:
                token = self.path.read_text().strip()
            except OSError as err:
                if self._token:  # keep the last good token through a rotation's brief gap
                    return self._token
                raise KubeconfigError(f"tokenFile {self.path}: {err.strerror or err}") from err
            self._token, self._read_at = token, now
        return self._token

    async def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.read()}"}


@dataclass
class PluginCredential:
    """An ``exec`` or ``auth-provider`` user, refreshed by kubernetes-asyncio when it expires."""

    configuration: Any  # kubernetes_asyncio.client.Configuration

    async def headers(self) -> dict[str, str]:
        settings = await self.configuration.auth_settings()
        bearer = settings.get("BearerToken") or {}
        headers = {"Authorization": bearer["value"]} if bearer.get("value") else {}
        if not headers and self.configuration.username:
            return await BasicAuth(self.configuration.username, self.configuration.password or "").headers()
        return headers


@dataclass
class Connection:
    """Everything a client needs to talk to one API server."""

    server: str
    ssl_context: ssl.SSLContext
    credential: Credential
    tls_server_name: str | None = None
    proxy: str | None = None


def tls_context(*, ca_file: str | None = None, ca_data: str | None = None, cert_file: str | None = None,
                key_file: str | None = None, cert_data: bytes | None = None, key_data: bytes | None = None,
                verify: bool = True) -> ssl.SSLContext:
    """The client side of TLS: whom to trust (a CA, else the system's) and which certificate to
    show. Certificates given as data are loaded through a private temporary file, which is
    removed at once (OpenSSL only loads a key pair from files)."""
    if not verify:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif ca_file or ca_data:
        context = ssl.create_default_context(cafile=ca_file, cadata=ca_data)
    else:
        context = ssl.create_default_context()
    if cert_file:
        context.load_cert_chain(cert_file, keyfile=key_file)
    elif cert_data:
        with tempfile.TemporaryDirectory(prefix="trainyard-tls-") as private:
            cert_path, key_path = Path(private) / "tls.crt", Path(private) / "tls.key"
            cert_path.write_bytes(cert_data)
            key_path.write_bytes(key_data or b"")
            os.chmod(key_path, 0o600)
            context.load_cert_chain(str(cert_path), keyfile=str(key_path) if key_data else None)
    return context


def _decoded(value: Any, where: str) -> bytes:
    try:
        return base64.b64decode(str(value), validate=True)
    except (binascii.Error, ValueError) as err:
        raise KubeconfigError(f"{where}: not valid base64 ({err})") from None


def _static_credential(user: dict[str, Any]) -> Credential:
    if user.get("token"):
        return BearerToken(str(user["token"]))
    if user.get("tokenFile"):
        return TokenFile(Path(str(user["tokenFile"])))
    if user.get("username") is not None and user.get("password") is not None:
        return BasicAuth(str(user["username"]), str(user["password"]))
    return Anonymous()


def _cluster_tls(cluster: dict[str, Any], user: dict[str, Any], where: str) -> ssl.SSLContext:
    ca_data = cluster.get("certificate-authority-data")
    try:
        return tls_context(
            ca_file=cluster.get("certificate-authority") or None,
            ca_data=_decoded(ca_data, f"{where} certificate-authority-data").decode() if ca_data else None,
            cert_file=user.get("client-certificate") or None,
            key_file=user.get("client-key") or None,
            cert_data=_decoded(user["client-certificate-data"], f"{where} client-certificate-data")
            if user.get("client-certificate-data") else None,
            key_data=_decoded(user["client-key-data"], f"{where} client-key-data")
            if user.get("client-key-data") else None,
            verify=not cluster.get("insecure-skip-tls-verify"),
        )
    except (OSError, ssl.SSLError, ValueError) as err:
        raise KubeconfigError(f"{where}: its certificates cannot be loaded: {err}") from err


def in_cluster_connection(resolved: ResolvedKubeconfig, directory: Path = IN_CLUSTER_DIR) -> Connection:
    server = resolved.server()
    if not server:
        raise KubeconfigError("in-cluster: KUBERNETES_SERVICE_HOST is not set")
    ca = directory / "ca.crt"
    try:
        context = tls_context(ca_file=str(ca))
    except (OSError, ssl.SSLError) as err:
        raise KubeconfigError(f"in-cluster: {ca}: {err}") from err
    return Connection(server=server, ssl_context=context, credential=TokenFile(directory / "token"))


async def connection_for(resolved: ResolvedKubeconfig) -> Connection:
    """The connection the resolved configuration describes."""
    if resolved.in_cluster:
        return in_cluster_connection(resolved)
    context = resolved.context()
    where = f"{resolved.source.describe()}, user {context.get('user', '')!r}"
    user, cluster = resolved.user(), resolved.cluster()
    if user.get("exec") or user.get("auth-provider"):
        return await _plugin_connection(resolved)
    server = cluster.get("server")
    if not server:
        raise KubeconfigError(f"{resolved.source.describe()}: cluster {context.get('cluster', '')!r} has no server")
    return Connection(
        server=str(server).rstrip("/"),
        ssl_context=_cluster_tls(cluster, user, where),
        credential=_static_credential(user),
        tls_server_name=cluster.get("tls-server-name") or None,
        proxy=cluster.get("proxy-url") or None,
    )


async def _plugin_connection(resolved: ResolvedKubeconfig) -> Connection:
    from kubernetes_asyncio import client as k8s_client
    from kubernetes_asyncio import config as k8s_config

    configuration = k8s_client.Configuration()
    try:
        await k8s_config.load_kube_config_from_dict(
            resolved.config, context=resolved.context_name, client_configuration=configuration)
    except k8s_config.ConfigException as err:
        raise KubeconfigError(f"{resolved.source.describe()}: {err}") from err
    try:
        context = tls_context(ca_file=configuration.ssl_ca_cert, cert_file=configuration.cert_file,
                              key_file=configuration.key_file, verify=configuration.verify_ssl)
    except (OSError, ssl.SSLError) as err:
        raise KubeconfigError(f"{resolved.source.describe()}: its certificates cannot be loaded: {err}") from err
    return Connection(server=configuration.host.rstrip("/"), ssl_context=context,
                      credential=PluginCredential(configuration),
                      tls_server_name=configuration.tls_server_name, proxy=configuration.proxy)
