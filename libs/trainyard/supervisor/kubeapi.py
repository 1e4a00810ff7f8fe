"""The few API server calls `trainyard up` makes: is it answering, and create-or-update."""
from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from trainyard.kube.client import KubeClient, KubeError
from trainyard.supervisor.manifests import Manifest, resource_path


class InstallError(Exception):
    pass


async def open_client(kubeconfig: Path) -> KubeClient:
    from trainyard.kube.kubeconfig import resolve

    return await KubeClient.from_resolved(resolve(kubeconfig))


# How long one install write may take: creating a CRD on a devcluster that starts beside two
# others on a loaded 2-core machine took longer than 10 s (the soak, load 25), and a write
# that is merely slow must not end `trainyard up` (whose whole start has its own budget).
WRITE_TIMEOUT_S = 60.0


async def _call(client: KubeClient, method: str, path: str, body: Any = None,
                content_type: str = "application/json", timeout_s: float = 10.0) -> Any:
    return await client.request(method, path, body=body, content_type=content_type, timeout_s=timeout_s)


def failure(what: str, err: KubeError, action: str = "call", timeout_s: float | None = None) -> InstallError:
    """One line for a failed install call: the server's answer, or that it did not answer."""
    if err.status == 0:
        within = f" within {timeout_s:g}s" if timeout_s is not None and "Timeout" in err.message else ""
        return InstallError(f"{what}: the API server did not answer its {action}{within} ({err.message})")
    return InstallError(f"{what}: HTTP {err.status} {err.reason}: {err.message}")


async def server_answers(kubeconfig: Path) -> bool:
    client = await open_client(kubeconfig)
    try:
        await _call(client, "GET", "/version")
        return True
    finally:
        await client.close()


async def create_or_update(client: KubeClient, manifest: Manifest, timeout_s: float = WRITE_TIMEOUT_S) -> str:
    """POST the manifest; if it exists, merge-patch it to the shipped content. Returns what happened."""
    path = resource_path(manifest)
    try:
        await _call(client, "POST", path.collection, manifest, timeout_s=timeout_s)
        return "created"
    except KubeError as err:
        if err.status != 409:
            raise failure(f"{manifest['kind']} {path.name}", err, "creation", timeout_s) from err
    try:
        await _call(client, "PATCH", path.item, manifest, content_type="application/merge-patch+json",
                    timeout_s=timeout_s)
    except KubeError as err:
        raise failure(f"{manifest['kind']} {path.name}", err, "update", timeout_s) from err
    return "updated"


async def is_served(client: KubeClient, group_version_path: str, plural: str) -> bool:
    """Whether the API server serves ``plural`` under ``/apis/<group>/<version>``."""
    try:
        listing = await _call(client, "GET", group_version_path)
    except KubeError as err:
        if err.status == 404:
            return False
        raise failure(group_version_path, err) from err
    return any(res.get("name") == plural for res in (listing or {}).get("resources") or [])


async def wait_until_served(client: KubeClient, collection_path: str, timeout_s: float) -> None:
    """A new CRD's resources become available a moment after the CRD is created."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            await _call(client, "GET", collection_path)
            return
        except KubeError as err:
            if err.status != 404 or time.monotonic() > deadline:
                raise failure(f"{collection_path} is not served", err) from err
        await asyncio.sleep(0.2)


async def delete_labelled(client: KubeClient, collection_path: str, selector: str, keep: set[str]) -> list[str]:
    """Delete the objects of a collection matching a label selector, except those named in
    ``keep``; returns the names deleted."""
    try:
        listing = await client.request("GET", collection_path, query={"labelSelector": selector})
    except KubeError as err:
        raise failure(f"listing {collection_path}", err) from err
    deleted = []
    for item in (listing or {}).get("items") or []:
        name = (item.get("metadata") or {}).get("name", "")
        if not name or name in keep:
            continue
        try:
            await _call(client, "DELETE", f"{collection_path}/{name}")
        except KubeError as err:
            if err.status != 404:
                raise failure(f"deleting {collection_path}/{name}", err) from err
        deleted.append(name)
    return deleted
