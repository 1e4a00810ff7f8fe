"""The API client reaches a cluster with every credential a kubeconfig can hold: a CA and a client
certificate given as data or as files, a bearer token (inline or a file that is rotated), basic
auth, a TLS server name, and a credential plugin (``exec``). Each case talks to a real TLS
server that checks what a Kubernetes API server would check."""
from __future__ import annotations

import asyncio
import base64
import json
import ssl
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from trainyard.kube.client import KubeClient
from trainyard.kube.connection import TokenFile
from trainyard.kube.kubeconfig import KubeconfigError, resolve
from trainyard.security import pki


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class Server:
    """An HTTPS server that answers /version with what it saw: the Authorization header and the
    client certificate's common name (it asks for one, as kube-apiserver does)."""

    def __init__(self, tmp_path: Path, hosts: list[str]) -> None:
        self.ca_pem, ca_key = pki.new_ca("test-ca")
        cert, key = pki.new_serving_cert(self.ca_pem, ca_key, hosts)
        self.client_cert, self.client_key = pki.new_serving_cert(
            self.ca_pem, ca_key, ["client"], common_name="alice", client_auth=True)
        (tmp_path / "server.crt").write_bytes(cert + self.ca_pem)
        (tmp_path / "server.key").write_bytes(key)
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cadata=self.ca_pem.decode())
        self.context.verify_mode = ssl.CERT_OPTIONAL
        self.context.load_cert_chain(tmp_path / "server.crt", tmp_path / "server.key")
        self.port = 0
        self.runner: web.AppRunner | None = None

    async def version(self, request: web.Request) -> web.Response:
        peer = request.transport.get_extra_info("peercert") if request.transport else None
        subject = dict(pair for rdn in (peer or {}).get("subject", ()) for pair in rdn)
        return web.json_response({"authorization": request.headers.get("Authorization", ""),
                                  "client": subject.get("commonName", "")})

    async def __aenter__(self) -> "Server":
        app = web.Application()
        app.router.add_get("/version", self.version)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0, ssl_context=self.context)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def __aexit__(self, *exc: Any) -> None:
        assert self.runner is not None
        await self.runner.cleanup()


def kubeconfig(cluster: dict[str, Any], user: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [{"name": "k", "cluster": cluster}], "users": [{"name": "u", "user": user}],
            "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}


async def seen(config: dict[str, Any]) -> dict[str, Any]:
    client = await KubeClient.from_kubeconfig_dict(config)
    try:
        return await client.request("GET", "/version", timeout_s=10)
    finally:
        await client.close()


def test_certificates_as_data_and_a_token(tmp_path: Path) -> None:
    async def scenario() -> dict[str, Any]:
        async with Server(tmp_path, ["127.0.0.1"]) as server:
            return await seen(kubeconfig(
                {"server": f"https://127.0.0.1:{server.port}", "certificate-authority-data": b64(server.ca_pem)},
                {"token": "abc", "client-certificate-data": b64(server.client_cert),
                 "client-key-data": b64(server.client_key)}))

    assert asyncio.run(scenario()) == {"authorization": "Bearer abc", "client": "alice"}


def test_certificates_as_files_basic_auth_and_a_tls_server_name(tmp_path: Path) -> None:
    """The server's certificate names only kube.example: tls-server-name makes it verify while
    the connection goes to 127.0.0.1."""
    async def scenario() -> dict[str, Any]:
        async with Server(tmp_path, ["kube.example"]) as server:
            for name, data in {"ca.crt": server.ca_pem, "tls.crt": server.client_cert,
                               "tls.key": server.client_key}.items():
                (tmp_path / name).write_bytes(data)
            path = tmp_path / "kubeconfig"
            path.write_text(json.dumps(kubeconfig(
                {"server": f"https://127.0.0.1:{server.port}", "certificate-authority": "ca.crt",
                 "tls-server-name": "kube.example"},
                {"username": "bob", "password": "pw", "client-certificate": "tls.crt", "client-key": "tls.key"})))
            client = await KubeClient.from_resolved(resolve(path))
            try:
                return await client.request("GET", "/version", timeout_s=10)
            finally:
                await client.close()

    answer = asyncio.run(scenario())
    assert answer == {"authorization": "Basic " + b64(b"bob:pw"), "client": "alice"}


def test_an_untrusted_server_is_refused_unless_told_to_skip_verification(tmp_path: Path) -> None:
    async def scenario() -> tuple[Any, Any]:
        async with Server(tmp_path, ["127.0.0.1"]) as server:
            other_ca, _ = pki.new_ca("someone-else")
            cluster = {"server": f"https://127.0.0.1:{server.port}", "certificate-authority-data": b64(other_ca)}
            try:
                refused: Any = await seen(kubeconfig(cluster, {"token": "t"}))
            except Exception as err:  # noqa: BLE001 - the failure is what is checked
                refused = err
            skipped = await seen(kubeconfig({"server": cluster["server"], "insecure-skip-tls-verify": True},
                                             {"token": "t"}))
            return refused, skipped

    refused, skipped = asyncio.run(scenario())
    assert getattr(refused, "status", None) == 0 and "certificate verify failed" in str(refused)
    assert skipped["authorization"] == "Bearer t"


def test_a_token_file_is_read_again_after_it_rotates(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("first\n")
    credential = TokenFile(token, reread_s=0.0)
    assert asyncio.run(credential.headers()) == {"Authorization": "Bearer first"}
    token.write_text("second")
    assert asyncio.run(credential.headers()) == {"Authorization": "Bearer second"}
    token.unlink()  # a rotation's brief gap keeps the last good token
    assert asyncio.run(credential.headers()) == {"Authorization": "Bearer second"}
    with pytest.raises(KubeconfigError, match="tokenFile .*missing"):
        asyncio.run(TokenFile(tmp_path / "missing").headers())


def test_an_exec_credential_plugin_supplies_the_token(tmp_path: Path) -> None:
    plugin = tmp_path / "plugin.py"
    plugin.write_text(textwrap.dedent("""
        import json
        print(json.dumps({"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
                          "status": {"token": "from-plugin"}}))
    """))

    async def scenario() -> dict[str, Any]:
        async with Server(tmp_path, ["127.0.0.1"]) as server:
            return await seen(kubeconfig(
                {"server": f"https://127.0.0.1:{server.port}", "certificate-authority-data": b64(server.ca_pem)},
                {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": sys.executable,
                          "args": [str(plugin)], "interactiveMode": "Never"}}))

    assert asyncio.run(scenario())["authorization"] == "Bearer from-plugin"


@pytest.mark.parametrize("field", ["certificate-authority-data", "client-certificate-data"])
def test_bad_certificate_data_names_the_field(field: str) -> None:
    cluster: dict[str, Any] = {"server": "https://127.0.0.1:1"}
    user: dict[str, Any] = {"token": "t"}
    (cluster if field.startswith("certificate") else user)[field] = "not base64!"
    with pytest.raises(KubeconfigError, match=field):
        asyncio.run(seen(kubeconfig(cluster, user)))


def test_a_service_does_not_import_kubernetes_asyncio() -> None:
    """Its package imports every generated model and a schema validator: about a second of CPU
    at each process start. A service needs none of it for certificates or tokens."""
    code = ("import sys, trainyard.host.runtime, trainyard_services.applier.service, "
            "trainyard_services.planner.service, trainyard_services.status.service, "
            "trainyard_services.watcher.service; print('kubernetes_asyncio' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
