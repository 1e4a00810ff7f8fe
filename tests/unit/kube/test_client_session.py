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
