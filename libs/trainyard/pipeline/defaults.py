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
    """A defaulted copy of a TrainingRuntime / ClusterTrainingRuntime document.

    Copy-on-write: the input is never modified; the small policy sections are copied, and
    the (large) JobSet template only along the replicated-job list, whose entries are new
    shallow dicts. Planning deep-copies the template itself before changing it.
    """
    doc = dict(runtime)
    spec = doc.get("spec")
    if not isinstance(spec, dict):
        return doc
    spec = doc["spec"] = dict(spec)
    ml_policy = spec.get("mlPolicy")
    if isinstance(ml_policy, dict):
        ml_policy = spec["mlPolicy"] = clone(ml_policy)
        torch = ml_policy.get("torch")
        if isinstance(torch, dict):
            torch.setdefault("numProcPerNode", "auto")
        mpi = ml_policy.get("mpi")
        if isinstance(mpi, dict):
            mpi.setdefault("numProcPerNode", names.MPI_DEFAULT_NUM_PROC_PER_NODE)
            mpi.setdefault("mpiImplementation", names.MPI_OPENMPI)
            mpi.setdefault("sshAuthMountPath", names.MPI_DEFAULT_SSH_MOUNT_PATH)
            mpi.setdefault("runLauncherAsNode", False)
    pod_group = spec.get("podGroupPolicy")
    if isinstance(pod_group, dict):
        pod_group = spec["podGroupPolicy"] = clone(pod_group)
        coscheduling = pod_group.get("coscheduling")
        if isinstance(coscheduling, dict):
            coscheduling.setdefault("scheduleTimeoutSeconds", names.DEFAULT_SCHEDULE_TIMEOUT_SECONDS)
        volcano = pod_group.get("volcano")
        if isinstance(volcano, dict):
            topology = volcano.get("networkTopology")
            if isinstance(topology, dict):
                topology.setdefault("mode", "hard")
                topology.setdefault("highestTierAllowed", 1)
    template = spec.get("template")
    if isinstance(template, dict) and isinstance(template.get("spec"), dict) \
            and isinstance(template["spec"].get("replicatedJobs"), list):
        template = spec["template"] = dict(template)
        jobset_spec = template["spec"] = dict(template["spec"])
        jobset_spec["replicatedJobs"] = [
            _replicated_job_with_defaults(job) if isinstance(job, dict) else job
            for job in jobset_spec["replicatedJobs"]
        ]
    return doc


def _replicated_job_with_defaults(job: dict[str, Any]) -> dict[str, Any]:
    if "groupName" in job and "replicas" in job:
        return dict(job)
    # Keep the familiar key order: name, groupName, replicas, then the rest.
    ordered: dict[str, Any] = {}
    if "name" in job:
        ordered["name"] = job["name"]
    ordered["groupName"] = job.get("groupName", "default")
    ordered["replicas"] = job.get("replicas", 1)
    for key, value in job.items():
        ordered.setdefault(key, value)
    return ordered
