"""The CRD OpenAPI defaults (spec §1.3), applied to plain documents before planning.

The API server applies these to stored objects; objects read from files (the CLI) or built
in memory have not been through it. The default *values* come from the API models
(``trainyard.api.defaults.server_defaults``, the same values the generated CRDs carry); this
module only walks the few places that have defaults, copy-on-write, so the (large) runtime
template is not deep-copied here. Absent or null fields are filled; an explicit empty string
stays as it is (as with OpenAPI defaults).
"""
from __future__ import annotations

from functools import cache
from typing import Any

from trainyard.api import jobset as jobset_models
from trainyard.api import trainer as trainer_models
from trainyard.api.defaults import server_defaults


@cache
def _defaults(model_name: str) -> tuple[tuple[str, Any], ...]:
    model = getattr(trainer_models, model_name, None) or getattr(jobset_models, model_name)
    return tuple(server_defaults(model).items())


def _filled(section: Any, model_name: str) -> Any:
    """A shallow copy of ``section`` with the model's defaults filled in (non-dicts as is)."""
    if not isinstance(section, dict):
        return section
    filled = dict(section)
    for key, default in _defaults(model_name):
        if filled.get(key) is None:
            filled[key] = default
    return filled


def trainjob_with_defaults(trainjob: dict[str, Any]) -> dict[str, Any]:
    doc = dict(trainjob)
    if isinstance(doc.get("spec"), dict):
        spec = doc["spec"] = _filled(doc["spec"], "TrainJobSpec")
        if isinstance(spec.get("runtimeRef"), dict):
            spec["runtimeRef"] = _filled(spec["runtimeRef"], "RuntimeRef")
    return doc


def runtime_with_defaults(runtime: dict[str, Any]) -> dict[str, Any]:
    """A defaulted copy of a TrainingRuntime / ClusterTrainingRuntime document.

    Copy-on-write: the input is never modified; only the sections on the way to a default are
    copied (shallowly). Planning deep-copies the JobSet template itself before changing it.
    """
    doc = dict(runtime)
    if not isinstance(doc.get("spec"), dict):
        return doc
    spec = doc["spec"] = dict(doc["spec"])
    if isinstance(spec.get("mlPolicy"), dict):
        ml_policy = spec["mlPolicy"] = dict(spec["mlPolicy"])
        for key, model in (("torch", "TorchMLPolicySource"), ("mpi", "MPIMLPolicySource")):
            if key in ml_policy:
                ml_policy[key] = _filled(ml_policy[key], model)
    if isinstance(spec.get("podGroupPolicy"), dict):
        pod_group = spec["podGroupPolicy"] = dict(spec["podGroupPolicy"])
        if "coscheduling" in pod_group:
            pod_group["coscheduling"] = _filled(pod_group["coscheduling"], "CoschedulingPodGroupPolicySource")
        volcano = pod_group.get("volcano")
        if isinstance(volcano, dict) and "networkTopology" in volcano:
            pod_group["volcano"] = {**volcano,
                                    "networkTopology": _filled(volcano["networkTopology"], "VolcanoNetworkTopology")}
    template = spec.get("template")
    if isinstance(template, dict) and isinstance(template.get("spec"), dict):
        template = spec["template"] = dict(template)
        jobset_spec = template["spec"] = dict(template["spec"])
        if "failurePolicy" in jobset_spec:
            jobset_spec["failurePolicy"] = _filled(jobset_spec["failurePolicy"], "FailurePolicy")
        if isinstance(jobset_spec.get("replicatedJobs"), list):
            jobset_spec["replicatedJobs"] = [_replicated_job_with_defaults(job)
                                             for job in jobset_spec["replicatedJobs"]]
    return doc


def _replicated_job_with_defaults(job: Any) -> Any:
    if not isinstance(job, dict):
        return job
    filled = _filled(job, "ReplicatedJob")
    # Keep the familiar key order: name, groupName, replicas, then the rest.
    ordered = {key: filled[key] for key in ("name", "groupName", "replicas") if key in filled}
    ordered.update(filled)
    return ordered
