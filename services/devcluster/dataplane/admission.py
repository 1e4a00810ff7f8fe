"""JobSet admission as the JobSet webhook does it (pure): create-time defaults and validation.

``default_jobset`` applies JOBSET-DATAPLANE.md §1.9 (plus the CRD defaults the API server would
add); ``validate_jobset`` returns the §1.10 messages for a create or an update.
"""
from __future__ import annotations

import copy
import re
from typing import Any

from trainyard.apimachinery.dns_names import DNS1035_LABEL, DNS1035_LABEL_MESSAGE, DNS1123_SUBDOMAIN, is_dns1123_subdomain

from .jobsets import CONTROLLER_NAME, JOB_FAILURE_REASONS

RULE_NAME = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
MAX_INT32 = 2147483647
ALLOWED_ACTIONS = ("FailJobSet", "RestartJobSet", "RestartJobSetAndIgnoreMaxRestarts")
GATED_ACTIONS = ("RestartJob", "RestartJobAndIgnoreMaxRestarts")
MUTABLE_WHILE_SUSPENDED = ("labels", "annotations", "nodeSelector", "tolerations", "schedulingGates")
ELASTIC_JOBSET = "ElasticJobSet"
# JobSet v0.12.0's feature gates (pkg/features): name -> default. The data plane implements
# ElasticJobSet; TLSOptions has nothing to do locally; the other two are refused when turned on.
FEATURE_GATES = {"InPlaceRestart": False, "TLSOptions": True, "RestartJob": False, ELASTIC_JOBSET: False}
IMPLEMENTED_GATES = {ELASTIC_JOBSET, "TLSOptions"}


def parse_feature_gates(text: str) -> frozenset[str]:
    """``ElasticJobSet=true,TLSOptions=false`` (JobSet's ``--feature-gates`` syntax) -> the gates
    that are on. ValueError with a one-line reason for an unknown gate, a value that is not a
    boolean, or a gate the data plane does not implement turned on."""
    enabled = {name for name, default in FEATURE_GATES.items() if default}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, sep, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not sep:
            raise ValueError(f"missing bool value for {name}")
        if name not in FEATURE_GATES:
            raise ValueError(f"unrecognized feature gate: {name}")
        lowered = value.lower()
        if lowered not in ("true", "false", "1", "0", "t", "f"):
            raise ValueError(f"invalid value of {name}={value}, err: strconv.ParseBool: parsing {value!r}: "
                             "invalid syntax")
        if lowered in ("true", "1", "t"):
            if name not in IMPLEMENTED_GATES:
                raise ValueError(f"feature gate {name} is not implemented by the devcluster data plane")
            enabled.add(name)
        else:
            enabled.discard(name)
    return frozenset(enabled)


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
    if not DNS1035_LABEL.match(value):
        return [DNS1035_LABEL_MESSAGE]
    return []


def validate_jobset(jobset: dict[str, Any], old: dict[str, Any] | None = None,
                    gates: frozenset[str] = frozenset()) -> list[str]:
    """Messages that deny the request (empty when allowed); ``gates``: the JobSet feature gates on."""
    if old is not None:
        return _validate_update(jobset, old, gates)
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
        if not is_dns1123_subdomain(subdomain):
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


def _finished(jobset: dict[str, Any]) -> bool:
    conditions = (jobset.get("status") or {}).get("conditions") or []
    return any(c.get("type") in ("Completed", "Failed") and c.get("status") == "True" for c in conditions)


def _elastic_update(new_rjobs: list[dict[str, Any]], old_rjobs: list[dict[str, Any]], old: dict[str, Any],
                    enabled: bool) -> tuple[list[dict[str, Any]], list[str]]:
    """JobSet v0.12.0's ``ElasticJobSet`` rules for an update: the replicated Jobs with
    ``parallelism``/``completions`` put back to their old values (so the immutability check
    ignores them) and the messages for the changes. With the gate on, an Indexed replicated
    Job may change both while the JobSet is not finished, each >= 1 and equal to each other;
    with it off, such a change is refused with a message naming the gate."""
    masked = copy.deepcopy(new_rjobs)
    errors: list[str] = []
    old_by_name = {r.get("name"): r for r in old_rjobs}
    finished = _finished(old)
    for index, rjob in enumerate(new_rjobs):
        before = old_by_name.get(rjob.get("name"))
        spec = (rjob.get("template") or {}).get("spec") or {}
        if before is None or spec.get("completionMode") != "Indexed":
            continue
        before_spec = (before.get("template") or {}).get("spec") or {}
        parallelism, completions = spec.get("parallelism"), spec.get("completions")
        parallelism_changed = parallelism != before_spec.get("parallelism")
        completions_changed = completions != before_spec.get("completions")
        path = f"spec.replicatedJobs[{index}].template.spec"
        if parallelism_changed or completions_changed:
            if not enabled:
                errors.append(f"{path}: Forbidden: parallelism and completions cannot be changed when "
                              "ElasticJobSet feature gate is disabled")
                continue  # not masked: the immutability error stays
            if finished:
                errors.append(f"{path}: Forbidden: Cannot mutate parallelism or completions when JobSet is in a "
                              "terminal state (Completed or Failed)")
            else:
                if parallelism_changed and parallelism is not None and parallelism < 1:
                    errors.append(f"{path}.parallelism: Invalid value: {parallelism}: parallelism must be >= 1")
                if completions_changed and completions is not None and completions < 1:
                    errors.append(f"{path}.completions: Invalid value: {completions}: completions must be >= 1")
                if parallelism is not None and completions is not None and parallelism != completions:
                    errors.append(f"{path}.completions: Invalid value: {completions}: completions must be equal "
                                  "to parallelism for Elastic Indexed Jobs")
        if enabled:
            masked_spec = (masked[index].get("template") or {}).get("spec") or {}
            for key in ("parallelism", "completions"):
                if key in before_spec:
                    masked_spec[key] = before_spec[key]
                else:
                    masked_spec.pop(key, None)
    return masked, errors


def _validate_update(new: dict[str, Any], old: dict[str, Any], gates: frozenset[str] = frozenset()) -> list[str]:
    errors: list[str] = []
    new_spec, old_spec = new.get("spec") or {}, old.get("spec") or {}
    suspended = bool(new_spec.get("suspend")) or bool(old_spec.get("suspend"))
    new_rjobs, old_rjobs = new_spec.get("replicatedJobs") or [], old_spec.get("replicatedJobs") or []
    new_rjobs, elastic_errors = _elastic_update(new_rjobs, old_rjobs, old, ELASTIC_JOBSET in gates)
    errors += elastic_errors
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
