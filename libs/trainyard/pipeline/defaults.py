"""The CRD OpenAPI defaults of spec §1.3, applied to plain documents.

The API server applies these to stored objects; objects read from files (the CLI) or built
in memory have not been through it, so planning applies them first. Only absent fields
are filled (an explicit empty string stays empty, as with OpenAPI defaults).
"""
from __future__ import annotations

from typing import Any

from . import names
from .documents import clone


def trainjob_with_defaults(trainjob: dict[str, Any]) -> dict[str, Any]:
    doc = dict(trainjob)
    spec = doc.get("spec")
    if not isinstance(spec, dict):
        return doc
    spec = dict(spec)
    doc["spec"] = spec
    ref = spec.get("runtimeRef")
    if isinstance(ref, dict):
        ref = dict(ref)
        ref.setdefault("apiGroup", names.API_GROUP)
        ref.setdefault("kind", names.CLUSTER_TRAINING_RUNTIME_KIND)
        spec["runtimeRef"] = ref
    spec.setdefault("suspend", False)
    spec.setdefault("managedBy", names.MANAGED_BY_DEFAULT)
    return doc


def runtime_with_defaults(runtime: dict[str, Any]) -> dict[str, Any]:
    """A defaulted deep copy of a TrainingRuntime / ClusterTrainingRuntime document."""
    doc = clone(runtime)
    spec = doc.get("spec")
    if not isinstance(spec, dict):
        return doc
    ml_policy = spec.get("mlPolicy")
    if isinstance(ml_policy, dict):
        torch = ml_policy.get("torch")
        if isinstance(torch, dict):
            torch.setdefault("numProcPerNode", "auto")
        mpi = ml_policy.get("mpi")
        if isinstance(mpi, dict):
            mpi.setdefault("numProcPerNode", 1)
            mpi.setdefault("mpiImplementation", names.MPI_OPENMPI)
            mpi.setdefault("sshAuthMountPath", names.MPI_DEFAULT_SSH_MOUNT_PATH)
            mpi.setdefault("runLauncherAsNode", False)
    pod_group = spec.get("podGroupPolicy")
    if isinstance(pod_group, dict):
        coscheduling = pod_group.get("coscheduling")
        if isinstance(coscheduling, dict):
            coscheduling.setdefault("scheduleTimeoutSeconds", names.DEFAULT_SCHEDULE_TIMEOUT_SECONDS)
        volcano = pod_group.get("volcano")
        if isinstance(volcano, dict):
            topology = volcano.get("networkTopology")
            if isinstance(topology, dict):
                topology.setdefault("mode", "hard")
                topology.setdefault("highestTierAllowed", 1)
    jobset_spec = spec.get("template", {}).get("spec") if isinstance(spec.get("template"), dict) else None
    if isinstance(jobset_spec, dict) and isinstance(jobset_spec.get("replicatedJobs"), list):
        jobset_spec["replicatedJobs"] = [
            _replicated_job_with_defaults(job) if isinstance(job, dict) else job
            for job in jobset_spec["replicatedJobs"]
        ]
    return doc


def _replicated_job_with_defaults(job: dict[str, Any]) -> dict[str, Any]:
    if "groupName" in job and "replicas" in job:
        return job
    # Keep the familiar key order: name, groupName, replicas, then the rest.
    ordered: dict[str, Any] = {}
    if "name" in job:
        ordered["name"] = job["name"]
    ordered["groupName"] = job.get("groupName", "default")
    ordered["replicas"] = job.get("replicas", 1)
    for key, value in job.items():
        ordered.setdefault(key, value)
    return ordered
