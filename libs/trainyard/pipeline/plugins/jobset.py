"""JobSet: endpoints, the JobSet document, and the JobSet-related admission rules (§4.6)."""
from __future__ import annotations

from trainyard.api import constants as c
from trainyard.apimachinery.dns_names import DNS1123_SUBDOMAIN, DNS1123_SUBDOMAIN_MESSAGE

import re
from typing import Any

from .. import elastic
from ..documents import clone, dig, ensure_list, ensure_mapping, items, mapping
from ..errors import FieldError, PlanningError, forbidden, internal, invalid, required
from ..framework import ChildKind, PlanContext, Plugin, ValidationContext, Verdict
from ..observed import ReadError
from ..upsert import api_env_var, upsert_env
from .shared import is_int

_RESERVED_OVERRIDE_CONTAINERS = (c.NODE, c.DATASET_INITIALIZER, c.MODEL_INITIALIZER)


def identify_pod_network(ctx: PlanContext) -> None:
    subdomain = dig(ctx.info.jobset_spec, "network", "subdomain") or ctx.name
    for pod_set in ctx.info.pod_sets:
        pod_set.endpoint_prefix = f"{ctx.name}-{pod_set.name}-"
        pod_set.subdomain = str(subdomain)


def build(ctx: PlanContext) -> list[dict[str, Any]]:
    try:
        existing = ctx.observed.get(c.JOBSET_API_VERSION, c.JOBSET_KIND, ctx.namespace, ctx.name)
    except ReadError as err:
        raise PlanningError(str(err)) from None
    if existing is not None and ctx.spec.get("suspend") is not True \
            and dig(existing, "spec", "suspend") is not True:
        if _elastic_resize(ctx, existing):
            # The one change to a running JobSet: an elastic trainer's parallelism and
            # completions together (JobSet's ElasticJobSet feature gate, docs/elastic.md).
            return [jobset_document(ctx)]
        return []  # a running JobSet is never modified
    return [jobset_document(ctx)]


def _elastic_resize(ctx: PlanContext, existing: dict[str, Any]) -> bool:
    if elastic.ANNOTATION_ELASTIC not in ctx.info.annotations:
        return False
    if any(mapping(cond).get("type") in ("Completed", "Failed") and mapping(cond).get("status") == "True"
           for cond in items(dig(existing, "status", "conditions"))):
        return False  # a finished JobSet is never resized
    trainer_set = ctx.info.pod_set_by_ancestor(c.ANCESTOR_TRAINER)
    size = elastic.jobset_size(existing)
    return trainer_set is not None and size is not None and size != trainer_set.count


def jobset_document(ctx: PlanContext) -> dict[str, Any]:
    spec = ctx.info.jobset_spec
    for pod_set in ctx.info.pod_sets:
        job_spec = ensure_mapping(ensure_mapping(pod_set.job, "template"), "spec")
        job_spec["parallelism"] = pod_set.count
        job_spec["completions"] = pod_set.count
    _apply_initializers(ctx)
    _apply_trainer(ctx)
    _apply_pod_metadata(ctx)
    spec["suspend"] = ctx.spec.get("suspend") is True
    metadata: dict[str, Any] = {"name": ctx.name, "namespace": ctx.namespace}
    if ctx.info.labels:
        metadata["labels"] = dict(ctx.info.labels)
    if ctx.info.annotations:
        metadata["annotations"] = dict(ctx.info.annotations)
    metadata["ownerReferences"] = [ctx.owner_reference()]
    return {"apiVersion": c.JOBSET_API_VERSION, "kind": c.JOBSET_KIND, "metadata": metadata, "spec": spec}


def _apply_initializers(ctx: PlanContext) -> None:
    initializer = mapping(ctx.spec.get("initializer"))
    for ancestor, section in ((c.ANCESTOR_DATASET_INITIALIZER, "dataset"), (c.ANCESTOR_MODEL_INITIALIZER, "model")):
        settings = initializer.get(section)
        for pod_set in ctx.info.pod_sets:
            if pod_set.ancestor != ancestor:
                continue
            pod_set.job["replicas"] = c.ANCESTOR_JOB_REPLICAS
            container = pod_set.container(ancestor)
            if container is None or not isinstance(settings, dict):
                continue
            storage_uri = settings.get("storageUri")
            if storage_uri is not None:  # set, even to "" (a Go pointer in upstream)
                upsert_env(ensure_list(container, "env"), {"name": c.ENV_STORAGE_URI, "value": str(storage_uri)})
            for entry in items(settings.get("env")):
                if isinstance(entry, dict):
                    upsert_env(ensure_list(container, "env"), api_env_var(entry))
            secret_ref = settings.get("secretRef")
            if isinstance(secret_ref, dict):
                ensure_list(container, "envFrom").append({"secretRef": {"name": secret_ref.get("name")}})


def _apply_trainer(ctx: PlanContext) -> None:
    for pod_set in ctx.info.pod_sets:
        if pod_set.ancestor == c.ANCESTOR_TRAINER:
            pod_set.job["replicas"] = c.ANCESTOR_JOB_REPLICAS  # even without spec.trainer
    trainer = ctx.trainer
    if trainer is None:
        return
    mpi = ctx.info.mpi_policy
    launcher_as_node = bool(mpi) and mpi.get("runLauncherAsNode") is True
    resources = trainer.get("resourcesPerNode")
    for pod_set in ctx.info.pod_sets:
        is_trainer = pod_set.ancestor == c.ANCESTOR_TRAINER
        if not is_trainer and not (launcher_as_node and pod_set.name == c.NODE):
            continue
        container = pod_set.container(c.NODE)
        if container is None:
            continue
        if is_trainer:
            if trainer.get("image") is not None:
                container["image"] = trainer["image"]
            command = ctx.info.torchtune_command or ctx.info.flux_command or trainer.get("command")
            if command is not None:
                container["command"] = list(command)
            if trainer.get("args") is not None and ctx.info.flux_command is None:
                container["args"] = list(trainer["args"])
        # v2.1.0 only: the resources replace the container's here; v2.3.0 merged them into the
        # runtime info already (info.merge_resources_per_node).
        if not ctx.compat.v2_3 and isinstance(resources, dict) \
                and (resources.get("limits") is not None or resources.get("requests") is not None):
            container["resources"] = {k: clone(resources[k]) for k in ("limits", "requests")
                                      if resources.get(k) is not None}
        if trainer.get("env"):
            env = ensure_list(container, "env")
            for entry in items(trainer.get("env")):
                if isinstance(entry, dict):
                    upsert_env(env, api_env_var(entry))


def _apply_pod_metadata(ctx: PlanContext) -> None:
    if not ctx.info.pod_labels and not ctx.info.pod_annotations:
        return
    for pod_set in ctx.info.pod_sets:
        job_spec = ensure_mapping(ensure_mapping(pod_set.job, "template"), "spec")
        pod_meta = ensure_mapping(ensure_mapping(job_spec, "template"), "metadata")
        if ctx.info.pod_labels:
            ensure_mapping(pod_meta, "labels").update(ctx.info.pod_labels)
        if ctx.info.pod_annotations:
            ensure_mapping(pod_meta, "annotations").update(ctx.info.pod_annotations)


# --- validation (§6.1.4) ---

def _container_names_by_job(jobset_spec: dict[str, Any]) -> dict[str, set[str]]:
    by_job: dict[str, set[str]] = {}
    for job in items(jobset_spec.get("replicatedJobs")):
        if not isinstance(job, dict):
            continue
        pod_spec = mapping(dig(job, "template", "spec", "template", "spec"))
        found = by_job.setdefault(str(job.get("name")), set())
        for key in ("initContainers", "containers"):
            found.update(str(c.get("name")) for c in items(pod_spec.get(key)) if isinstance(c, dict))
    return by_job


def validate(ctx: ValidationContext) -> Verdict:
    verdict = Verdict()
    if ctx.info is None:
        return verdict
    # Deviation (docs/compatibility.md): container names are checked against the runtime
    # template *before* the overrides are merged, so an unknown container is reported
    # (upstream merges first and then cannot see it).
    runtime_jobset = mapping(dig(ctx.runtime.spec, "template", "spec"))
    containers_by_job = _container_names_by_job(runtime_jobset)
    runtime_ref = ctx.spec.get("runtimeRef")
    initializer = mapping(ctx.spec.get("initializer"))
    for section, job_name, missing_job, missing_container in (
            ("dataset", c.DATASET_INITIALIZER, c.ERR_DATASET_INITIALIZER_JOB, c.ERR_DATASET_INITIALIZER_CONTAINER),
            ("model", c.MODEL_INITIALIZER, c.ERR_MODEL_INITIALIZER_JOB, c.ERR_MODEL_INITIALIZER_CONTAINER)):
        if initializer.get(section) is None:
            continue
        if job_name not in containers_by_job:
            verdict.errors.append(invalid("spec.runtimeRef", runtime_ref, missing_job))
        elif job_name not in containers_by_job[job_name]:
            verdict.errors.append(invalid("spec.runtimeRef", runtime_ref, missing_container))
        elif ctx.compat.v2_3 and not _mounts_initializer_volume(ctx.info.jobset_spec, job_name):
            # v2.3.0: the initializer writes where the trainer reads, through this mount.
            verdict.errors.append(invalid("spec.runtimeRef", runtime_ref, initializer_mount_message(job_name)))
    verdict.errors.extend(_override_mutation_errors(ctx))
    verdict.errors.extend(_override_errors(ctx, containers_by_job))
    verdict.errors.extend(_patch_mutation_errors(ctx))
    verdict.errors.extend(_patch_errors(ctx, containers_by_job))
    return verdict


INITIALIZER_VOLUME = "initializer"


def initializer_mount_message(job_name: str) -> str:
    return f"must have volumeMount with name - {INITIALIZER_VOLUME} in container {job_name} of the {job_name} job"


def _mounts_initializer_volume(jobset_spec: dict[str, Any], job_name: str) -> bool:
    """Whether the initializer container of the job of that name (in the runtime as the TrainJob
    patches it) mounts the volume named ``initializer`` (v2.3.0's JobSet webhook rule)."""
    for job in items(jobset_spec.get("replicatedJobs")):
        if not isinstance(job, dict) or job.get("name") != job_name:
            continue
        for container in items(dig(job, "template", "spec", "template", "spec", "containers")):
            if isinstance(container, dict) and container.get("name") == job_name and any(
                    mapping(mount).get("name") == INITIALIZER_VOLUME for mount in items(container.get("volumeMounts"))):
                return True
    return False


_PATCHES = "spec.runtimePatches"
_HTTP_PATH_FMT = "[A-Za-z0-9/\\-._~%!$&'()*+,;=:]+"
_HTTP_PATH = re.compile("^" + _HTTP_PATH_FMT + "$")


def domain_prefixed_path_errors(field: str, value: str) -> list[FieldError]:
    """Kubernetes' ``IsDomainPrefixedPath`` (a patch's manager, e.g. ``kueue.x-k8s.io/manager``)."""
    if not value:
        return [required(field)]
    host, slash, path = value.partition("/")
    if not slash or not host or not path:
        return [invalid(field, value, c.ERR_DOMAIN_PREFIXED_PATH)]
    errors = []
    if len(host) > 253:
        errors.append(invalid(field, host, "must be no more than 253 characters"))
    if not DNS1123_SUBDOMAIN.match(host):
        errors.append(invalid(field, host, DNS1123_SUBDOMAIN_MESSAGE))
    if not _HTTP_PATH.match(path):
        errors.append(invalid(field, path, f"Invalid path (regex used for validation is '{_HTTP_PATH_FMT}')"))
    return errors


def _patch_mutation_errors(ctx: ValidationContext) -> list[FieldError]:
    """v2.3.0: runtime patches change only while the TrainJob is suspended before or after the
    update (Kueue updates them and suspend in one request), and never under active Jobs."""
    if ctx.old is None:
        return []
    if (mapping(ctx.old.get("spec")).get("runtimePatches") or None) == (ctx.spec.get("runtimePatches") or None):
        return []
    if mapping(ctx.old.get("spec")).get("suspend") is not True and ctx.spec.get("suspend") is not True:
        return [forbidden(_PATCHES, c.ERR_PATCHES_NOT_SUSPENDED)]
    name = str(dig(ctx.trainjob, "metadata", "name") or "")
    namespace = str(dig(ctx.trainjob, "metadata", "namespace") or "")
    try:
        jobset = ctx.observed.get(c.JOBSET_API_VERSION, c.JOBSET_KIND, namespace, name)
    except ReadError as err:
        return [internal(_PATCHES, str(err))]
    return [forbidden(_PATCHES, c.ERR_PATCHES_JOB_ACTIVE.format(job=status.get("name")))
            for status in items(dig(jobset, "status", "replicatedJobsStatus"))
            if isinstance(status, dict) and is_int(status.get("active")) and status["active"] > 0]


def _patch_errors(ctx: ValidationContext, containers_by_job: dict[str, set[str]]) -> list[FieldError]:
    errors: list[FieldError] = []
    patches = ctx.spec.get("runtimePatches")
    for patch in items(patches):
        patch = mapping(patch)
        errors.extend(domain_prefixed_path_errors(f"{_PATCHES}.manager", str(patch.get("manager") or "")))
        for job_patch in items(dig(patch, "trainingRuntimeSpec", "template", "spec", "replicatedJobs")):
            job = str(mapping(job_patch).get("name"))
            if job not in containers_by_job:
                errors.append(invalid(_PATCHES, patches, c.ERR_PATCH_JOB_NOT_FOUND))
                continue
            known = containers_by_job[job]
            pod_patch = mapping(dig(job_patch, "template", "spec", "template", "spec"))
            for init in items(pod_patch.get("initContainers")):
                if mapping(init).get("name") not in known:
                    errors.append(invalid(_PATCHES, patches, c.ERR_MISSING_INIT_CONTAINER.format(job=job)))
            for container in items(pod_patch.get("containers")):
                container = mapping(container)
                if container.get("name") not in known:
                    errors.append(invalid(_PATCHES, patches, c.ERR_MISSING_CONTAINER.format(job=job)))
                elif container.get("name") in _RESERVED_OVERRIDE_CONTAINERS and container.get("env"):
                    errors.append(invalid(_PATCHES, patches, c.ERR_OVERRIDE_ENVS))
    return errors


def _override_mutation_errors(ctx: ValidationContext) -> list[FieldError]:
    if ctx.old is None:
        return []
    old_overrides = mapping(ctx.old.get("spec")).get("podTemplateOverrides")
    new_overrides = ctx.spec.get("podTemplateOverrides")
    if (old_overrides or None) == (new_overrides or None):
        return []
    field = "spec.podTemplateOverrides"
    if ctx.spec.get("suspend") is not True:
        return [forbidden(field, c.ERR_OVERRIDES_NOT_SUSPENDED)]
    name = str(dig(ctx.trainjob, "metadata", "name") or "")
    namespace = str(dig(ctx.trainjob, "metadata", "namespace") or "")
    try:
        jobset = ctx.observed.get(c.JOBSET_API_VERSION, c.JOBSET_KIND, namespace, name)
    except ReadError as err:
        return [internal(field, str(err))]
    if jobset is None:
        return []
    return [forbidden(field, f"PodTemplateOverrides cannot be modified when the JobSet's ReplicatedJob "
                             f"{status.get('name')} is still active")
            for status in items(dig(jobset, "status", "replicatedJobsStatus"))
            if isinstance(status, dict) and is_int(status.get("active")) and status["active"] > 0]


def _override_errors(ctx: ValidationContext, containers_by_job: dict[str, set[str]]) -> list[FieldError]:
    errors: list[FieldError] = []
    field = "spec.podTemplateOverrides"
    overrides = ctx.spec.get("podTemplateOverrides")
    for override in items(overrides):
        if not isinstance(override, dict):
            continue
        override_spec = mapping(override.get("spec"))
        for target in items(override.get("targetJobs")):
            job = str(mapping(target).get("name"))
            if job not in containers_by_job:
                errors.append(invalid(field, overrides,
                                      c.ERR_TARGET_JOB_NOT_FOUND))
            known = containers_by_job.get(job, set())
            for init in items(override_spec.get("initContainers")):
                if mapping(init).get("name") not in known:
                    errors.append(invalid(field, overrides,
                                          f"must not have initContainer that doesn't exist in the runtime job {job}"))
            for container in items(override_spec.get("containers")):
                container = mapping(container)
                if container.get("name") not in known:
                    errors.append(invalid(field, overrides,
                                          f"must not have container that doesn't exist in the runtime job {job}"))
                elif container.get("name") in _RESERVED_OVERRIDE_CONTAINERS and container.get("env"):
                    errors.append(invalid(field, overrides, c.ERR_OVERRIDE_ENVS))
    return errors


PLUGIN = Plugin(name="JobSet", identify_pod_network=identify_pod_network, build=build, validate=validate,
                children=(ChildKind("jobset.x-k8s.io/v1alpha2", "JobSet"),))
