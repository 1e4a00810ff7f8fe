"""The few API server calls `trainyard up` makes: is it answering, and create-or-update."""
from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from trainyard.supervisor.manifests import Manifest, resource_path


class InstallError(Exception):
    pass


async def open_client(kubeconfig: Path) -> Any:
    from trainyard.kube.kubeconfig import api_client, resolve

    return await api_client(resolve(kubeconfig))


# How long one install write may take: creating a CRD on a devcluster that starts beside two
# others on a loaded 2-core machine took longer than 10 s (the soak, load 25), and a write
# that is merely slow must not end `trainyard up` (whose whole start has its own budget).
WRITE_TIMEOUT_S = 60.0


async def _call(client: Any, method: str, path: str, body: Any = None, content_type: str = "application/json",
                timeout_s: float = 10.0) -> Any:
    return await client.call_api(
        path,
        method,
        header_params={"Accept": "application/json", "Content-Type": content_type},
        body=body,
        response_types_map={200: "object", 201: "object"},
        auth_settings=["BearerToken"],
        _return_http_data_only=True,
        _request_timeout=timeout_s,
    )


async def server_answers(kubeconfig: Path) -> bool:
    client = await open_client(kubeconfig)
    try:
        await _call(client, "GET", "/version")
        return True
    finally:
        await client.close()


async def create_or_update(client: Any, manifest: Manifest, timeout_s: float = WRITE_TIMEOUT_S) -> str:
    """POST the manifest; if it exists, merge-patch it to the shipped content. Returns what happened."""
    from kubernetes_asyncio.client.exceptions import ApiException

    path = resource_path(manifest)
    try:
        await _call(client, "POST", path.collection, manifest, timeout_s=timeout_s)
        return "created"
    except ApiException as err:
        if err.status != 409:
            raise InstallError(f"{manifest['kind']} {path.name}: HTTP {err.status} {err.reason}: {err.body}") from err
    except asyncio.TimeoutError:
        raise InstallError(f"{manifest['kind']} {path.name}: the API server did not answer its creation "
                           f"within {timeout_s:g}s") from None
    try:
        await _call(client, "PATCH", path.item, manifest, content_type="application/merge-patch+json",
                    timeout_s=timeout_s)
    except ApiException as err:
        raise InstallError(f"{manifest['kind']} {path.name}: HTTP {err.status} {err.reason}: {err.body}") from err
    except asyncio.TimeoutError:
        raise InstallError(f"{manifest['kind']} {path.name}: the API server did not answer its update "
                           f"within {timeout_s:g}s") from None
    return "updated"


async def is_served(client: Any, group_version_path: str, plural: str) -> bool:
    """Whether the API server serves ``plural`` under ``/apis/<group>/<version>``."""
    from kubernetes_asyncio.client.exceptions import ApiException

    try:
        listing = await _call(client, "GET", group_version_path)
    except ApiException as err:
        if err.status == 404:
            return False
        raise InstallError(f"{group_version_path}: HTTP {err.status} {err.reason}") from err
    return any(res.get("name") == plural for res in (listing or {}).get("resources") or [])


async def wait_until_served(client: Any, collection_path: str, timeout_s: float) -> None:
    """A new CRD's resources become available a moment after the CRD is created."""
    from kubernetes_asyncio.client.exceptions import ApiException

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            await _call(client, "GET", collection_path)
            return
        except ApiException as err:
            if err.status != 404 or time.monotonic() > deadline:
                raise InstallError(f"{collection_path} is not served: HTTP {err.status} {err.reason}") from err
        await asyncio.sleep(0.2)


async def delete_labelled(client: Any, collection_path: str, selector: str, keep: set[str]) -> list[str]:
    """Delete the objects of a collection matching a label selector, except those named in
    ``keep``; returns the names deleted."""
    from urllib.parse import quote

    from kubernetes_asyncio.client.exceptions import ApiException

    listing = await _call(client, "GET", f"{collection_path}?labelSelector={quote(selector)}")
    deleted = []
    for item in (listing or {}).get("items") or []:
        name = (item.get("metadata") or {}).get("name", "")
        if not name or name in keep:
            continue
        try:
            await _call(client, "DELETE", f"{collection_path}/{name}")
        except ApiException as err:
            if err.status != 404:
                raise InstallError(f"deleting {collection_path}/{name}: HTTP {err.status} {err.reason}") from err
        deleted.append(name)
    return deleted
