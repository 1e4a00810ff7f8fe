"""PersistentVolumeClaims on one node: each claim is a directory ``<data-dir>/claims/<ns>/<name>``
that outlives the pods mounting it (checkpoints survive a suspend or a pod restart).

There are no PersistentVolumes or storage classes: a claim is shown ``Bound`` with the capacity
it requested as soon as it exists, and its directory is removed when the claim is deleted
(a TrainJob's claim goes with its JobSet unless the policy says ``Retain``).
"""
from __future__ import annotations

import asyncio
import logging
import shutil
from pathlib import Path
from typing import Any

from trainyard.errortext import describe
from trainyard.kube.client import KubeClient, KubeError

from .informers import PVC, Informer, key_of

log = logging.getLogger(__name__)


def claim_directory(claims_dir: Path, namespace: str, name: str) -> Path:
    return claims_dir / namespace / name


def bound_status(claim: dict[str, Any]) -> dict[str, Any]:
    """The status a bound claim shows: phase, its access modes and the storage it asked for."""
    spec = claim.get("spec") or {}
    status: dict[str, Any] = {"phase": "Bound"}
    if spec.get("accessModes"):
        status["accessModes"] = list(spec["accessModes"])
    storage = ((spec.get("resources") or {}).get("requests") or {}).get("storage")
    if storage:
        status["capacity"] = {"storage": storage}
    return status


class ClaimBinder:
    """Marks claims Bound and removes a deleted claim's directory."""

    def __init__(self, client: KubeClient, claims: Informer, claims_dir: Path) -> None:
        self.client = client
        self.claims_dir = claims_dir
        self._tasks: set[asyncio.Task[None]] = set()
        claims.listeners.append(self._on_claim)

    def _on_claim(self, event: str, claim: dict[str, Any]) -> None:
        if event == "DELETED":
            self._spawn(self._remove(claim))
        elif (claim.get("status") or {}).get("phase") != "Bound":
            self._spawn(self._bind(claim))

    def _spawn(self, work: Any) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _bind(self, claim: dict[str, Any]) -> None:
        namespace, name = key_of(claim)
        claim_directory(self.claims_dir, namespace, name).mkdir(parents=True, exist_ok=True)
        try:
            await self.client.request("PATCH", PVC.path(namespace, name, "status"),
                                      body={"status": bound_status(claim)},
                                      content_type="application/merge-patch+json")
        except KubeError as err:
            if not err.not_found:
                log.warning("claim %s/%s: status write failed: %s", namespace, name, describe(err))

    async def _remove(self, claim: dict[str, Any]) -> None:
        namespace, name = key_of(claim)
        directory = claim_directory(self.claims_dir, namespace, name)
        await asyncio.to_thread(shutil.rmtree, directory, True)
