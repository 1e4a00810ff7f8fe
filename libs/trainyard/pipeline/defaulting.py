"""The TrainJob mutating admission webhook of v2.3.0 (``defaulter.trainjob.trainer.kubeflow.org``,
upstream's ``TrainJobDefaulter`` in ``pkg/webhooks/trainjob_webhook.go``): it stamps
``spec.runtimePatches[].time`` with the time a patch was last written.

On create, every patch without a time gets the request's time (a time the client set is kept).
On update, a patch whose manager had a patch before keeps that patch's time when nothing but the
time changed, else gets the request's time; a patch of a new manager keeps a time the client set,
else gets the request's time. The answer is a JSON Patch (RFC 6902) of the TrainJob.
"""
from __future__ import annotations

import datetime as dt
from typing import Any

from trainyard.clock import format_time

from .documents import dig, items

DEFAULTER_WEBHOOK = "defaulter.trainjob.trainer.kubeflow.org"
DEFAULTER_PATH = "/mutate-trainer-kubeflow-org-v1alpha1-trainjob"
DEFAULTER_CONFIGURATION = "defaulter.trainer.kubeflow.org"


def _without_time(patch: Any) -> Any:
    return {k: v for k, v in patch.items() if k != "time"} if isinstance(patch, dict) else patch


def runtime_patch_times(new: dict[str, Any], old: dict[str, Any] | None, now: dt.datetime) -> list[dict[str, Any]]:
    """JSON Patch operations that set each ``spec.runtimePatches[i].time`` as upstream's
    defaulter does (empty when nothing changes)."""
    stamp = format_time(now)
    patches = dig(new, "spec", "runtimePatches")
    if not isinstance(patches, list):
        return []
    before: dict[Any, dict[str, Any]] = {}
    if old is not None:
        for patch in items(dig(old, "spec", "runtimePatches")):
            if isinstance(patch, dict):
                before[patch.get("manager")] = patch
    operations: list[dict[str, Any]] = []
    for index, patch in enumerate(patches):
        if not isinstance(patch, dict):
            continue
        current = patch.get("time")
        previous = before.get(patch.get("manager")) if old is not None else None
        if previous is not None:
            wanted = previous.get("time") if _without_time(previous) == _without_time(patch) else stamp
        else:
            wanted = current if current is not None else stamp
        if wanted == current:
            continue
        path = f"/spec/runtimePatches/{index}/time"
        if wanted is None:
            operations.append({"op": "remove", "path": path})
        else:
            operations.append({"op": "replace" if "time" in patch else "add", "path": path, "value": wanted})
    return operations


