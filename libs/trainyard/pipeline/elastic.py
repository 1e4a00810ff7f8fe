"""Elastic PyTorch training (issue #17): the decisions planning, admission and status share.

A runtime is elastic when its torch policy has ``elasticPolicy``. Its TrainJobs run torchrun
with a c10d rendezvous on node 0 and ``--nnodes=<minNodes>:<maxNodes>``; ``spec.trainer.numNodes``
is the current size (the scale subresource's replicas) and must lie within the bounds. A bound
the policy leaves out is pinned to ``numNodes``: the job cannot be resized in that direction
(docs/elastic.md). Pure functions, no I/O.
"""
from __future__ import annotations

from trainyard.api import constants as c

import json
from dataclasses import dataclass
from typing import Any

from .documents import dig, items, mapping
from .errors import FieldError, invalid, required

# The JobSet annotation that marks an elastic plan (the status service reads it back).
ANNOTATION_ELASTIC = "trainyard.kubeflow.org/elastic-policy"
NUM_NODES_FIELD = "spec.trainer.numNodes"
RDZV_BACKEND = "c10d"
ENV_DISABLE_SHARED_STORE = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
# Exit codes of a container killed by a signal (SIGKILL, SIGTERM): a lost pod, replaced by the
# Job. Any other non-zero exit of torchrun is final (its restart budget is spent).
SIGNAL_EXIT_CODES = (137, 143)
REASON_RESIZED = "Resized"
REASON_RESTARTS_EXHAUSTED = "ElasticRestartsExhausted"
CONDITION_RESIZING = "Resizing"
REASON_RESIZE_REFUSED = "ResizeRefused"
HPA_API_VERSION = "autoscaling/v2"
HPA_KIND = "HorizontalPodAutoscaler"


@dataclass(frozen=True)
class Bounds:
    min_nodes: int
    max_nodes: int
    max_restarts: int | None
    # Whether each bound was set by the policy (an absent one is pinned to numNodes).
    min_set: bool
    max_set: bool


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def policy_of(runtime_spec: dict[str, Any] | None) -> dict[str, Any] | None:
    """The runtime's torch ``elasticPolicy``, or None for a non-elastic runtime."""
    policy = dig(runtime_spec or {}, "mlPolicy", "torch", "elasticPolicy")
    return policy if isinstance(policy, dict) else None


def bounds(policy: dict[str, Any], num_nodes: int | None) -> Bounds | None:
    """The node bounds of ``policy`` for a TrainJob of ``num_nodes`` nodes (None when the
    TrainJob has no numNodes and the policy leaves a bound out: nothing to pin it to)."""
    low, high = _int(policy.get("minNodes")), _int(policy.get("maxNodes"))
    if (low is None or high is None) and num_nodes is None:
        return None
    return Bounds(min_nodes=low if low is not None else int(num_nodes),  # type: ignore[arg-type]
                  max_nodes=high if high is not None else int(num_nodes),  # type: ignore[arg-type]
                  max_restarts=_int(policy.get("maxRestarts")),
                  min_set=low is not None, max_set=high is not None)


def _describe(found: Bounds) -> str:
    return f"minNodes ({found.min_nodes}) and maxNodes ({found.max_nodes})"


def num_nodes_errors(trainjob: dict[str, Any], old: dict[str, Any] | None,
                     runtime_spec: dict[str, Any]) -> list[FieldError]:
    """Admission: an elastic runtime needs ``spec.trainer.numNodes`` within its bounds; a resize
    needs the bound in its direction to be set. Non-elastic runtimes: nothing."""
    policy = policy_of(runtime_spec)
    if policy is None:
        return []
    num_nodes = _int(dig(trainjob, "spec", "trainer", "numNodes"))
    old_nodes = _int(dig(old, "spec", "trainer", "numNodes")) if old is not None else None
    # A bound the policy leaves out is pinned to the size the TrainJob was created with.
    pinned = old_nodes if old_nodes is not None else num_nodes
    found = bounds(policy, pinned)
    if num_nodes is None:
        text = "required when the runtime's torch elasticPolicy is set"
        if found is not None:
            text += f" (between {_describe(found)})"
        return [required(NUM_NODES_FIELD, text)]
    assert found is not None
    if not found.min_nodes <= num_nodes <= found.max_nodes:
        if old_nodes is not None and (not found.min_set or not found.max_set) and num_nodes != old_nodes:
            side = "maxNodes" if num_nodes > old_nodes else "minNodes"
            return [invalid(NUM_NODES_FIELD, num_nodes,
                            f"the runtime's torch elasticPolicy sets no {side}, so numNodes cannot "
                            f"{'grow beyond' if side == 'maxNodes' else 'shrink below'} {old_nodes}")]
        return [invalid(NUM_NODES_FIELD, num_nodes,
                        f"must be between {_describe(found)} of the runtime's torch elasticPolicy")]
    return []


def rendezvous_id(trainjob: dict[str, Any]) -> str:
    """Per TrainJob: its uid, or its name when it has none (read from a file)."""
    meta = mapping(trainjob.get("metadata"))
    return str(meta.get("uid") or meta.get("name") or "")


def torchrun_env(trainjob_name: str, rdzv_id: str, found: Bounds, nproc: int | str,
                 master: str) -> list[dict[str, Any]]:
    """The ``PET_*`` variables of an elastic trainer (in place of the fixed NNODES/NODE_RANK/
    MASTER_ADDR/MASTER_PORT): torchrun's ``--nnodes=min:max``, ``--max-restarts``, c10d
    rendezvous on node 0's stable name and the trainer port, one rendezvous id per TrainJob."""
    env = [
        {"name": c.ENV_PET_NNODES, "value": f"{found.min_nodes}:{found.max_nodes}"},
        {"name": c.ENV_PET_NPROC_PER_NODE, "value": str(nproc)},
    ]
    if found.max_restarts is not None:
        env.append({"name": "PET_MAX_RESTARTS", "value": str(found.max_restarts)})
    env += [
        {"name": "PET_RDZV_BACKEND", "value": RDZV_BACKEND},
        {"name": "PET_RDZV_ENDPOINT", "value": f"{master}:{c.CONTAINER_TRAINER_PORT}"},
        {"name": "PET_RDZV_ID", "value": rdzv_id},
        # torchrun >= 2.4 shares the rendezvous TCPStore with the workers; a node that joins a
        # running group then waits forever for the store address, which node 0 publishes only in
        # its first round. Without sharing, every round publishes it (docs/elastic.md).
        {"name": ENV_DISABLE_SHARED_STORE, "value": "1"},
    ]
    return env


def pod_failure_policy() -> dict[str, Any]:
    """A pod whose ``node`` container exits non-zero other than by a signal fails the Job at
    once (torchrun's budget is spent); a pod lost to a signal or a disruption is replaced."""
    return {"rules": [
        {"action": "FailJob", "onExitCodes": {"containerName": c.NODE, "operator": "NotIn",
                                              "values": list(SIGNAL_EXIT_CODES)}},
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
    ]}


def annotation_value(found: Bounds) -> str:
    return json.dumps({"minNodes": found.min_nodes, "maxNodes": found.max_nodes,
                       "maxRestarts": found.max_restarts}, separators=(",", ":"), sort_keys=True)


def jobset_policy(jobset: dict[str, Any] | None) -> dict[str, Any] | None:
    """The elastic bounds an elastic plan wrote on its JobSet, or None."""
    raw = dig(jobset or {}, "metadata", "annotations", ANNOTATION_ELASTIC)
    if not isinstance(raw, str):
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def trainer_job(jobset: dict[str, Any] | None) -> dict[str, Any] | None:
    """The JobSet's trainer replicated job (ancestor label ``trainer``, else the job ``node``)."""
    jobs = [mapping(j) for j in items(dig(jobset or {}, "spec", "replicatedJobs"))]
    for job in jobs:
        if dig(job, "template", "metadata", "labels", c.LABEL_TRAINJOB_ANCESTOR) == c.ANCESTOR_TRAINER:
            return job
    return next((j for j in jobs if j.get("name") == c.NODE), None)


def jobset_size(jobset: dict[str, Any] | None) -> int | None:
    """The trainer size a JobSet runs at: its trainer job's parallelism."""
    job = trainer_job(jobset)
    return _int(dig(job or {}, "template", "spec", "parallelism"))


def selector(trainjob_name: str, jobset: dict[str, Any] | None) -> str:
    """The label selector of the trainer pods (the scale subresource's, for an HPA)."""
    job = trainer_job(jobset)
    job_name = str((job or {}).get("name") or c.NODE)
    return f"jobset.sigs.k8s.io/jobset-name={trainjob_name},jobset.sigs.k8s.io/replicatedjob-name={job_name}"


def hpa_document(trainjob: dict[str, Any], found: Bounds, metrics: list[Any],
                 owner_reference: dict[str, Any]) -> dict[str, Any]:
    """The autoscaling/v2 HorizontalPodAutoscaler that drives the TrainJob's scale subresource."""
    meta = mapping(trainjob.get("metadata"))
    return {
        "apiVersion": HPA_API_VERSION,
        "kind": HPA_KIND,
        "metadata": {"name": str(meta.get("name") or ""), "namespace": str(meta.get("namespace") or ""),
                     "ownerReferences": [owner_reference]},
        "spec": {
            "scaleTargetRef": {"apiVersion": str(trainjob.get("apiVersion") or c.TRAINER_API_VERSION),
                               "kind": c.TRAIN_JOB_KIND, "name": str(meta.get("name") or "")},
            "minReplicas": found.min_nodes,
            "maxReplicas": found.max_nodes,
            "metrics": [dict(m) if isinstance(m, dict) else m for m in metrics],
        },
    }


def failed_message(policy: dict[str, Any], jobset_message: str) -> str:
    restarts = policy.get("maxRestarts")
    budget = f"maxRestarts: {restarts}" if restarts is not None else "no maxRestarts: torchrun's default 0"
    return (f"torchrun exited non-zero after spending its restart budget ({budget}), or the trainer "
            f"pods were lost more often than that budget allows: {jobset_message}")
