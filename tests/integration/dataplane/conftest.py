"""Fixtures of the data plane integration tests: an API client and a fresh namespace per test."""
from __future__ import annotations

import uuid

import pytest

from trainyard.kube.resources import Resource

NAMESPACE = Resource("", "v1", "namespaces", "Namespace", False)


@pytest.fixture
async def kube(dataplane_cluster):
    client = await dataplane_cluster.client()
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
async def ns(kube):
    name = f"t-{uuid.uuid4().hex[:6]}"
    await kube.create(NAMESPACE, None, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    return name
