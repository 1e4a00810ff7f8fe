"""What delegating a TrainJob to a worker cluster means, object by object (pure).

The manager's TrainJob carries ``spec.managedBy: kueue.x-k8s.io/multikueue`` (Kueue's value, so
manifests written for MultiKueue carry over); the worker gets a copy without ``managedBy``
that the worker's own trainyard runs, labelled with the manager's cluster name as Kueue labels
its copies. The manager TrainJob records the chosen worker in an annotation and keeps
upstream's status schema: conditions and jobsStatus are the worker copy's.
"""
from __future__ import annotations

import copy
from typing import Any, Iterable, Iterator, Mapping

from trainyard.pipeline.lifecycle import is_finished

MULTIKUEUE_MANAGED_BY = "kueue.x-k8s.io/multikueue"
ORIGIN_LABEL = "kueue.x-k8s.io/multikueue-origin"
# On the manager TrainJob: the worker that runs it (the `-o wide` Cluster column reads it).
WORKER_ANNOTATION = "trainyard.kubeflow.org/worker-cluster"
# On the worker copy: the manager TrainJob's uid, so a copy left by a deleted-and-recreated
# TrainJob of the same name is recognised and replaced.
ORIGIN_UID_ANNOTATION = "trainyard.kubeflow.org/origin-uid"
FINALIZER = "trainyard.kubeflow.org/multicluster-dispatch"
# The manager-only condition saying where the TrainJob was dispatched (or why not yet).
CONDITION_DISPATCHED = "Dispatched"

# Written by clients, meaningless (or harmful) on the copy.
_DROPPED_ANNOTATIONS = ("kubectl.kubernetes.io/last-applied-configuration", WORKER_ANNOTATION)


def is_delegated(trainjob: Mapping[str, Any]) -> bool:
    return (trainjob.get("spec") or {}).get("managedBy") == MULTIKUEUE_MANAGED_BY


def assigned_worker(trainjob: Mapping[str, Any]) -> str | None:
    return ((trainjob.get("metadata") or {}).get("annotations") or {}).get(WORKER_ANNOTATION) or None


def suspended(trainjob: Mapping[str, Any]) -> bool:
    return bool((trainjob.get("spec") or {}).get("suspend"))


def worker_copy(trainjob: Mapping[str, Any], manager_cluster: str) -> dict[str, Any]:
    """The TrainJob to create on the worker: same namespace, name and spec, no managedBy."""
    meta = trainjob.get("metadata") or {}
    spec = copy.deepcopy(dict(trainjob.get("spec") or {}))
    spec.pop("managedBy", None)
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k not in _DROPPED_ANNOTATIONS}
    annotations[ORIGIN_UID_ANNOTATION] = meta.get("uid") or ""
    return {
        "apiVersion": trainjob.get("apiVersion") or "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "labels": {**(meta.get("labels") or {}), ORIGIN_LABEL: manager_cluster},
            "annotations": annotations,
        },
        "spec": spec,
    }


def copy_is_current(copy_obj: Mapping[str, Any], trainjob: Mapping[str, Any], manager_cluster: str) -> bool:
    """Whether a TrainJob found on a worker is this manager TrainJob's copy (not a stale one of
    an earlier TrainJob of the same name, nor a TrainJob someone created there directly)."""
    meta = copy_obj.get("metadata") or {}
    return ((meta.get("labels") or {}).get(ORIGIN_LABEL) == manager_cluster
            and (meta.get("annotations") or {}).get(ORIGIN_UID_ANNOTATION) == (trainjob.get("metadata") or {}).get("uid"))


def _walk(node: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield key, value
            yield from _walk(value)
    elif isinstance(node, list):
        for item in node:
            yield from _walk(item)


def referenced_objects(trainjob: Mapping[str, Any]) -> tuple[set[str], set[str]]:
    """Names of the ConfigMaps and Secrets the TrainJob's spec refers to (volumes, env, envFrom,
    projected sources, imagePullSecrets), wherever they sit in the spec: these must exist on
    the worker before its pods can start."""
    configmaps: set[str] = set()
    secrets: set[str] = set()
    for key, value in _walk(trainjob.get("spec") or {}):
        if not isinstance(value, (dict, list)):
            continue
        if key in ("configMap", "configMapKeyRef", "configMapRef") and isinstance(value, dict):
            if isinstance(value.get("name"), str) and value["name"]:
                configmaps.add(value["name"])
        elif key == "secret" and isinstance(value, dict):
            name = value.get("secretName") or value.get("name")  # volume / projected source
            if isinstance(name, str) and name:
                secrets.add(name)
        elif key in ("secretKeyRef", "secretRef") and isinstance(value, dict):
            if isinstance(value.get("name"), str) and value["name"]:
                secrets.add(value["name"])
        elif key == "imagePullSecrets" and isinstance(value, list):
            secrets.update(item["name"] for item in value if isinstance(item, dict) and isinstance(item.get("name"), str))
    return configmaps, secrets


def replica_of(obj: Mapping[str, Any], manager_cluster: str) -> dict[str, Any]:
    """A ConfigMap or Secret as written to the worker: data kept, server fields dropped."""
    meta = obj.get("metadata") or {}
    out = {key: copy.deepcopy(value) for key, value in obj.items()
           if key not in ("metadata", "status")}
    out["metadata"] = {
        "name": meta.get("name"),
        "namespace": meta.get("namespace"),
        "labels": {**(meta.get("labels") or {}), ORIGIN_LABEL: manager_cluster},
        "annotations": {k: v for k, v in (meta.get("annotations") or {}).items()
                        if k not in _DROPPED_ANNOTATIONS},
    }
    return out


def dispatched_condition(status: str, reason: str, message: str, now: str,
                         previous: Mapping[str, Any] | None) -> dict[str, Any]:
    unchanged = previous is not None and previous.get("status") == status
    return {"type": CONDITION_DISPATCHED, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": previous.get("lastTransitionTime", now) if unchanged and previous else now}


def mirrored_status(manager: Mapping[str, Any], copy_obj: Mapping[str, Any] | None,
                    dispatched: Mapping[str, Any] | None) -> dict[str, Any]:
    """The manager TrainJob's status: the worker copy's (every field, so what v2.3 adds such as
    trainerStatus carries over), with the Dispatched condition first; the copy's conditions
    follow in their order, so `kubectl get` State (the last condition) reads the worker's."""
    mirrored: dict[str, Any] = copy.deepcopy(dict((copy_obj or {}).get("status") or {}))
    if copy_obj is None:
        # Nothing to mirror yet (not dispatched, or a re-dispatch started over): keep what the
        # manager shows only for its own condition.
        mirrored = {}
    conditions = [c for c in mirrored.get("conditions") or [] if c.get("type") != CONDITION_DISPATCHED]
    if dispatched is not None:
        conditions.insert(0, dict(dispatched))
    if conditions:
        mirrored["conditions"] = conditions
    else:
        mirrored.pop("conditions", None)
    return mirrored


def condition(obj: Mapping[str, Any] | None, kind: str) -> dict[str, Any] | None:
    return next((c for c in ((obj or {}).get("status") or {}).get("conditions") or [] if c.get("type") == kind), None)


def with_dispatched(trainjob: Mapping[str, Any], dispatched: Mapping[str, Any]) -> dict[str, Any]:
    """The TrainJob's status with ``dispatched`` as its first condition (the others kept)."""
    current = dict(trainjob.get("status") or {})
    conditions = [c for c in current.get("conditions") or [] if c.get("type") != CONDITION_DISPATCHED]
    current["conditions"] = [dict(dispatched), *conditions]
    return current


def running_on(delegated: Iterable[Mapping[str, Any]]) -> dict[str, set[str]]:
    """Per worker, the ``namespace/name`` of the TrainJobs that may run there now (placed
    there, neither finished nor suspended): the holds a resync keeps."""
    running: dict[str, set[str]] = {}
    for trainjob in delegated:
        worker = assigned_worker(trainjob)
        if worker is not None and not is_finished(trainjob) and not suspended(trainjob):
            meta = trainjob["metadata"]
            running.setdefault(worker, set()).add(f"{meta['namespace']}/{meta['name']}")
    return running


def stale_copies(copies: Iterable[Mapping[str, Any]], manager: Iterable[Mapping[str, Any]], worker: str,
                 manager_cluster: str) -> list[Mapping[str, Any]]:
    """The metadata of the copies on ``worker`` (``copies``, listed before the manager's
    TrainJobs ``manager``) that the manager no longer points at: its TrainJob gone, with another
    uid, or placed on another worker. Copies being deleted are left to finish."""
    owners = {(tj["metadata"]["namespace"], tj["metadata"]["name"]): tj for tj in manager}
    stale = []
    for copy_obj in copies:
        meta = copy_obj["metadata"]
        if meta.get("deletionTimestamp"):
            continue
        owner = owners.get((meta["namespace"], meta["name"]))
        if owner is not None and assigned_worker(owner) == worker and copy_is_current(copy_obj, owner, manager_cluster):
            continue
        stale.append(meta)
    return stale
