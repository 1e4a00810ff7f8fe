"""JobSet admission as the JobSet webhook does it (pure): create-time defaults and validation.

``default_jobset`` applies JOBSET-DATAPLANE.md §1.9 (plus the CRD defaults the API server would
add); ``validate_jobset`` returns the §1.10 messages for a create or an update.
"""
from __future__ import annotations

import copy
import re
from typing import Any

from .jobsets import CONTROLLER_NAME, JOB_FAILURE_REASONS

DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
RULE_NAME = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
DNS1035_MESSAGE = ("a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with "
                   "an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or "
                   "'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')")
MAX_INT32 = 2147483647
ALLOWED_ACTIONS = ("FailJobSet", "RestartJobSet", "RestartJobSetAndIgnoreMaxRestarts")
GATED_ACTIONS = ("RestartJob", "RestartJobAndIgnoreMaxRestarts")
MUTABLE_WHILE_SUSPENDED = ("labels", "annotations", "nodeSelector", "tolerations", "schedulingGates")


def default_jobset(jobset: dict[str, Any]) -> dict[str, Any]:
    """A defaulted copy (§1.9 webhook defaults and the CRD's schema defaults)."""
    out = copy.deepcopy(jobset)
    spec = out.setdefault("spec", {})
    spec.setdefault("successPolicy", {"operator": "All"})
    spec.setdefault("startupPolicy", {"startupPolicyOrder": "AnyOrder"})
    for rjob in spec.get("replicatedJobs") or []:
        rjob.setdefault("replicas", 1)
        rjob.setdefault("groupName", "default")
        job_spec = rjob.setdefault("template", {}).setdefault("spec", {})
        job_spec.setdefault("completionMode", "Indexed")
        pod_spec = job_spec.setdefault("template", {}).setdefault("spec", {})
        if not pod_spec.get("restartPolicy"):
            pod_spec["restartPolicy"] = "OnFailure"
    network = spec.get("network")
    if network is None:
        network = spec["network"] = {}
    network.setdefault("enableDNSHostnames", True)
    network.setdefault("publishNotReadyAddresses", True)
    policy = spec.get("failurePolicy")
    if policy is not None:
        policy.setdefault("restartStrategy", "Recreate")
        for number, rule in enumerate(policy.get("rules") or []):
            if not rule.get("name"):
                rule["name"] = f"failurePolicyRule{number}"
    return out


def _dns1035(value: str, too_long: str) -> list[str]:
    if len(value) > 63:
        return [too_long]
    if not DNS1035.match(value):
        return [DNS1035_MESSAGE]
    return []


def validate_jobset(jobset: dict[str, Any], old: dict[str, Any] | None = None) -> list[str]:
    """Messages that deny the request (empty when allowed)."""
    if old is not None:
        return _validate_update(jobset, old)
    errors: list[str] = []
    meta = jobset.get("metadata") or {}
    spec = jobset.get("spec") or {}
    name = meta.get("name") or meta.get("generateName") or ""
    rjobs = spec.get("replicatedJobs") or []
    names = [r.get("name", "") for r in rjobs]
    if rjobs and rjobs[0].get("dependsOn"):
        errors.append("DependsOn can't be set for the first ReplicatedJob")
    if (spec.get("startupPolicy") or {}).get("startupPolicyOrder") == "InOrder" and any(r.get("dependsOn") for r in rjobs):
        errors.append("StartupPolicy and DependsOn APIs are mutually exclusive")
    subdomain = (spec.get("network") or {}).get("subdomain")
    if subdomain:
        if not DNS1123_SUBDOMAIN.match(subdomain) or len(subdomain) > 253:
            errors.append(f"spec.network.subdomain: Invalid value: {subdomain!r}: a lowercase RFC 1123 subdomain")
        errors += _dns1035(subdomain, ".spec.network.subdomain is too long, must be less than 63 characters")
    managed_by = spec.get("managedBy")
    if managed_by is not None and managed_by != CONTROLLER_NAME:
        if len(managed_by) > 63:
            errors.append("spec.managedBy: Too long: may not be more than 63 bytes")
        if "/" not in managed_by or not DNS1123_SUBDOMAIN.match(managed_by.split("/", 1)[0]):
            errors.append(f"spec.managedBy: Invalid value: {managed_by!r}: must be a domain-prefixed path "
                          "(such as \"acme.io/foo\")")
    for position, rjob in enumerate(rjobs):
        rname = rjob.get("name", "")
        replicas = int(rjob.get("replicas") if rjob.get("replicas") is not None else 1)
        job_spec = (rjob.get("template") or {}).get("spec") or {}
        parallelism = int(job_spec.get("parallelism") if job_spec.get("parallelism") is not None else 1)
        if parallelism * replicas > MAX_INT32:
            errors.append(f"the product of replicas and parallelism must not exceed 2147483647 for replicatedJob '{rname}'")
        group = rjob.get("groupName") or "default"
        errors += _dns1035(group, ".spec.replicatedJob[].groupName is too long, must be less than 63 characters")
        job_name = f"{name}-{rname}-{max(replicas - 1, 0)}"
        errors += _dns1035(job_name, "JobSet name is too long, job names generated for this JobSet will exceed 63 characters")
        completions = job_spec.get("completions")
        if (job_spec.get("completionMode") or "Indexed") == "Indexed" and completions is not None:
            pod_name = f"{job_name}-{max(int(completions) - 1, 0)}-abcde"
            if len(pod_name) > 63:
                errors.append("JobSet name is too long, pod names generated for this JobSet will exceed 63 characters")
        for dependency in rjob.get("dependsOn") or []:
            if dependency.get("name") not in names[:position + 1]:
                errors.append(f"replicatedJob: {rname} cannot depend on replicatedJob: {dependency.get('name')}")
    for target in (spec.get("successPolicy") or {}).get("targetReplicatedJobs") or []:
        if target not in names:
            errors.append(f"invalid replicatedJob name '{target}' does not appear in .spec.ReplicatedJobs")
    policy = spec.get("failurePolicy") or {}
    if policy.get("restartStrategy") == "InPlaceRestart":
        errors.append("InPlaceRestart restart strategy cannot be set when InPlaceRestart feature gate is disabled")
    seen: dict[str, list[int]] = {}
    for number, rule in enumerate(policy.get("rules") or []):
        rule_name = rule.get("name") or f"failurePolicyRule{number}"
        seen.setdefault(rule_name, []).append(number)
        if not 1 <= len(rule_name) <= 128:
            errors.append(f"invalid failure policy rule name of length {len(rule_name)}, the rule name must be at "
                          "least 1 characters long and at most 128 characters long")
        elif not RULE_NAME.match(rule_name):
            errors.append(f"invalid failure policy rule name '{rule_name}', a failure policy rule name must start "
                          "with an alphabetic character, optionally followed by a string of alphanumeric characters "
                          "or '_,:', and must end with an alphanumeric character or '_'")
        if rule.get("action") in GATED_ACTIONS:
            errors.append("RestartJob and RestartJobAndIgnoreMaxRestarts failure policy actions are not allowed "
                          "when RestartJob feature gate is disabled")
        elif rule.get("action") not in ALLOWED_ACTIONS:
            errors.append(f"spec.failurePolicy.rules[{number}].action: Unsupported value: {rule.get('action')!r}")
        for target in rule.get("targetReplicatedJobs") or []:
            if target not in names:
                errors.append(f"invalid replicatedJob name '{target}' in failure policy does not appear in .spec.ReplicatedJobs")
        for reason in rule.get("onJobFailureReasons") or []:
            if reason not in JOB_FAILURE_REASONS:
                errors.append(f"invalid job failure reason '{reason}' in failure policy is not a recognized job failure reason")
    for rule_name, positions in seen.items():
        if len(positions) > 1:
            errors.append(f"rule names are not unique, rules with indices [{' '.join(map(str, positions))}] "
                          f"all have the same name '{rule_name}'")
    coordinator = spec.get("coordinator")
    if coordinator:
        target = next((r for r in rjobs if r.get("name") == coordinator.get("replicatedJob")), None)
        if target is None:
            errors.append(f"coordinator replicatedJob {coordinator.get('replicatedJob')} does not exist")
        else:
            job_index = int(coordinator.get("jobIndex") or 0)
            pod_index = int(coordinator.get("podIndex") or 0)
            replicas = int(target.get("replicas") if target.get("replicas") is not None else 1)
            job_spec = (target.get("template") or {}).get("spec") or {}
            if not 0 <= job_index < replicas:
                errors.append(f"coordinator job index {job_index} is invalid for replicatedJob {target['name']}")
            elif (job_spec.get("completionMode") or "Indexed") != "Indexed" or job_spec.get("completions") is None:
                errors.append("job for coordinator pod must be indexed completion mode, and completions number must be set")
            elif not 0 <= pod_index < int(job_spec["completions"]):
                errors.append(f"coordinator pod index {pod_index} is invalid for replicatedJob "
                              f"{target['name']} job index {job_index}")
    return errors


def _strip_mutable(rjobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = copy.deepcopy(rjobs)
    for rjob in out:
        pod_template = (((rjob.get("template") or {}).get("spec") or {}).get("template")) or {}
        metadata = pod_template.get("metadata") or {}
        for key in ("labels", "annotations"):
            metadata.pop(key, None)
        if not metadata:
            pod_template.pop("metadata", None)
        pod_spec = pod_template.get("spec") or {}
        for key in ("nodeSelector", "tolerations", "schedulingGates"):
            pod_spec.pop(key, None)
    return out


def _validate_update(new: dict[str, Any], old: dict[str, Any]) -> list[str]:
    errors: list[str] = []
    new_spec, old_spec = new.get("spec") or {}, old.get("spec") or {}
    suspended = bool(new_spec.get("suspend")) or bool(old_spec.get("suspend"))
    new_rjobs, old_rjobs = new_spec.get("replicatedJobs") or [], old_spec.get("replicatedJobs") or []
    if suspended:
        changed = _strip_mutable(new_rjobs) != _strip_mutable(old_rjobs)
    else:
        changed = new_rjobs != old_rjobs
    if changed:
        errors.append("spec.replicatedJobs: Invalid value: field is immutable")
    if new_spec.get("managedBy") != old_spec.get("managedBy"):
        errors.append("spec.managedBy: Invalid value: field is immutable")
    for key in ("network", "successPolicy", "failurePolicy", "startupPolicy"):
        if key in old_spec and new_spec.get(key) != old_spec.get(key):
            errors.append(f"spec.{key}: Invalid value: Value is immutable")
    return errors
