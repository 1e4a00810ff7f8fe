"""The API client does not look up ~/.netrc and the proxy variables on every request unless a
proxy is configured (each lookup is a worker-thread hop per API call)."""
from __future__ import annotations

import asyncio

import pytest
import yaml

from trainyard.kube.client import KubeClient

KUBECONFIG = {
    "apiVersion": "v1", "kind": "Config", "current-context": "c",
    "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443", "insecure-skip-tls-verify": True}}],
    "users": [{"name": "u", "user": {"token": "t"}}],
    "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
}


def trusts_environment(monkeypatch, **env) -> bool:
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)

    async def build() -> bool:
        client = await KubeClient.from_kubeconfig_dict(yaml.safe_load(yaml.safe_dump(KUBECONFIG)))
        try:
            return client._session.trust_env
        finally:
            await client.close()

    return asyncio.run(build())


def test_no_environment_lookups_without_a_proxy(monkeypatch):
    assert trusts_environment(monkeypatch) is False


@pytest.mark.parametrize("variable", ["HTTPS_PROXY", "https_proxy", "ALL_PROXY"])
def test_a_configured_proxy_is_still_honoured(monkeypatch, variable):
    assert trusts_environment(monkeypatch, **{variable: "http://proxy.example:3128"}) is True


def test_requests_go_through_while_many_watches_stream() -> None:
    """Each watch holds a connection while it streams; the devcluster's data plane keeps a
    dozen open in one client. A GET beside 24 open watches must not queue for a connection
    (a limit of 10 connections made every kubelet status write time out)."""
    from aiohttp import web

    from trainyard.kube.resources import resource_for

    async def scenario() -> dict:
        release = asyncio.Event()

        async def watch(request: web.Request) -> web.StreamResponse:
            response = web.StreamResponse()
            await response.prepare(request)
            await release.wait()
            return response

        async def version(request: web.Request) -> web.Response:
            return web.json_response({"gitVersion": "v1.31.0"})

        app = web.Application()
        app.router.add_get("/api/v1/pods", watch)
        app.router.add_get("/version", version)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        config = {**KUBECONFIG, "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}]}
        client = await KubeClient.from_kubeconfig_dict(config)
        pods = resource_for("v1", "Pod")

        async def follow() -> None:
            async for _ in client.watch(pods, "1"):
                pass

        watches = [asyncio.create_task(follow()) for _ in range(24)]
        try:
            await asyncio.sleep(0.3)
            return await client.request("GET", "/version", timeout_s=5)
        finally:
            release.set()
            await asyncio.gather(*watches, return_exceptions=True)
            await client.close()
            await runner.cleanup()

    assert asyncio.run(scenario()) == {"gitVersion": "v1.31.0"}
