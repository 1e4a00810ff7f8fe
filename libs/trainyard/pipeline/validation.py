"""Admission validation: the CRD schema/CEL rules and the validating webhooks (spec §1, §6).

``validate_trainjob`` and ``validate_runtime`` answer what the API server would: schema
and CEL violations first (HTTP 422, the webhook is not called), then the webhook's
verdict (HTTP 403 when denied, warnings in both cases).
"""
from __future__ import annotations

from trainyard.api import constants as c

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from . import names
from .defaults import runtime_with_defaults, trainjob_with_defaults
from .documents import as_document, dig, items, mapping
from .errors import ErrorType, FieldError, PlanningError, aggregate_message, internal, invalid, not_supported
from .framework import Plugin, ValidationContext, run_validation
from .info import build_info
from .observed import ObservedState
from .plugins import REGISTRY
from trainyard.apimachinery.json_types import json_type_name
from trainyard.apimachinery.quantity import QuantityError
from .resolution import (SUPPORTED_KEYS, ResolvedRuntime, RuntimeLookupError, created_deprecation_warning,
                         is_deprecated, lookup_runtime, referenced_deprecation_warning, registry_key,
                         unsupported_runtime_message)

_RFC1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_STORAGE_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://.+$")
# v2.3.0: pod spec fields of a runtime patch that never change once written.
_PATCH_IMMUTABLE_POD_FIELDS = ("serviceAccountName", "volumes", "initContainers", "containers",
                               "imagePullSecrets", "securityContext", "terminationGracePeriodSeconds")
_ANCESTOR_CONTAINERS = {
    names.ANCESTOR_TRAINER: names.NODE,
    names.ANCESTOR_DATASET: names.DATASET_INITIALIZER,
    names.ANCESTOR_MODEL: names.MODEL_INITIALIZER,
}
TRAINJOB_WEBHOOK = "validator.trainjob.trainer.kubeflow.org"
TRAINING_RUNTIME_WEBHOOK = "validator.trainingruntime.trainer.kubeflow.org"
CLUSTER_TRAINING_RUNTIME_WEBHOOK = "validator.clustertrainingruntime.trainer.kubeflow.org"

# Schema checks supplied by the API models (type errors as "path: message" texts).
SchemaCheck = Callable[[dict[str, Any]], list[FieldError]]


@dataclass
class ValidationResult:
    """The admission answer for one object.

    ``code``: 200 allowed, 422 rejected by the schema/CEL rules, 403 denied by the webhook.
    ``errors`` are field errors; ``plain_errors`` are webhook denials without a field path
    (``unsupported runtime: <key>``).
    """

    code: int = 200
    errors: list[FieldError] = field(default_factory=list)
    plain_errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    webhook: str = ""

    @property
    def allowed(self) -> bool:
        return self.code == 200

    def texts(self) -> list[str]:
        """Every error as Kubernetes renders it, in the order produced."""
        return [str(e) for e in self.errors] + list(self.plain_errors)

    def message(self) -> str:
        """The denial text a webhook returns (``AdmissionResponse.status.message``)."""
        return aggregate_message(self.texts())

    def kubectl_message(self, kind: str, name: str) -> str:
        """What kubectl prints after ``Error from server (...)`` for this rejection."""
        if self.code == 422:
            texts = self.texts()
            body = texts[0] if len(texts) == 1 else "\n" + "\n".join(f"* {t}" for t in texts)
            return f'{kind}.{names.API_GROUP} "{name}" is invalid: {body}'
        return f'admission webhook "{self.webhook}" denied the request: {self.message()}'


def cel_error(field_path: str, value: Any, message: str) -> FieldError:
    return FieldError(ErrorType.INVALID, field_path, json_type_name(value), message)


def model_schema_errors(doc: dict[str, Any]) -> list[FieldError]:
    """Type errors found by the API models (``trainyard.api``), as field errors."""
    from trainyard.api.objects import FieldError as ModelFieldError
    from trainyard.api.objects import parse_object

    try:
        parse_object(doc)
    except ModelFieldError as err:
        found = []
        for line in err.errors:
            path, _, detail = line.partition(": ")
            found.append(FieldError(ErrorType.INVALID, path, detail=detail))
        return found
    return []


def _schema_errors(new: dict[str, Any], old: dict[str, Any] | None,
                   crd_rules: Callable[[dict[str, Any], dict[str, Any] | None], list[FieldError]],
                   schema_check: SchemaCheck | None) -> list[FieldError]:
    """Type errors and the CRD rules. The rules assume well-typed input, so with type errors
    they only replace a type error on the same field by their Kubernetes wording."""
    typed = schema_check(new) if schema_check else []
    if not typed:
        return crd_rules(new, old)
    try:
        own = {error.field: error for error in crd_rules(new, old)}
    except (TypeError, AttributeError, KeyError, ValueError):
        own = {}
    return [own.get(error.field, error) for error in typed]


# --- TrainJob -----------------------------------------------------------------------------

def trainjob_schema_errors(new: dict[str, Any], old: dict[str, Any] | None) -> list[FieldError]:
    """The TrainJob CRD's structural and CEL rules (§1.1) on a defaulted object."""
    errors: list[FieldError] = []
    name = dig(new, "metadata", "name")
    if not isinstance(name, str) or not name:
        errors.append(FieldError(ErrorType.REQUIRED, "metadata.name", detail="name or generateName is required"))
    else:
        # Deviation (docs/compatibility.md): shown on metadata.name rather than the root.
        if not _RFC1035_LABEL.match(name):
            errors.append(invalid("metadata.name", name, names.MESSAGE_NAME_RFC1035))
        if len(name) > c.MAX_TRAIN_JOB_NAME_LENGTH:
            errors.append(invalid("metadata.name", name, names.MESSAGE_NAME_TOO_LONG))
    spec = new.get("spec")
    if spec is None:
        return errors
    if not isinstance(spec, dict):
        return errors + [invalid("spec", spec, "must be of type object")]
    ref = spec.get("runtimeRef")
    if not isinstance(ref, dict):
        errors.append(FieldError(ErrorType.REQUIRED, "spec.runtimeRef"))
    elif not ref.get("name"):
        if "name" not in ref:
            errors.append(FieldError(ErrorType.REQUIRED, "spec.runtimeRef.name"))
        else:
            errors.append(invalid("spec.runtimeRef.name", ref.get("name"),
                                  "spec.runtimeRef.name in body should be at least 1 chars long"))
    managed_by = spec.get("managedBy")
    if managed_by is not None and managed_by not in (names.MANAGED_BY_DEFAULT, names.MANAGED_BY_MULTIKUEUE):
        errors.append(cel_error("spec.managedBy", managed_by, names.MESSAGE_MANAGED_BY_VALUES))
    for index, override in enumerate(items(spec.get("podTemplateOverrides"))):
        base = f"spec.podTemplateOverrides[{index}]"
        targets = mapping(override).get("targetJobs")
        if targets is None:
            errors.append(FieldError(ErrorType.REQUIRED, f"{base}.targetJobs"))
        for t_index, target in enumerate(items(targets)):
            if not mapping(target).get("name"):
                errors.append(FieldError(ErrorType.REQUIRED, f"{base}.targetJobs[{t_index}].name"))
        for key in ("initContainers", "containers"):
            for c_index, container in enumerate(items(dig(override, "spec", key))):
                if not mapping(container).get("name"):
                    errors.append(FieldError(ErrorType.REQUIRED, f"{base}.spec.{key}[{c_index}].name"))
    for section in ("dataset", "model"):
        uri = dig(spec, "initializer", section, "storageUri")
        if isinstance(uri, str) and uri != "" and not _STORAGE_URI.match(uri):
            errors.append(cel_error(f"spec.initializer.{section}.storageUri", uri, c.MESSAGE_STORAGE_URI))
    deadline = spec.get("activeDeadlineSeconds")
    if isinstance(deadline, int) and not isinstance(deadline, bool) and deadline < 1:
        errors.append(invalid("spec.activeDeadlineSeconds", deadline,
                              "spec.activeDeadlineSeconds in body should be greater than or equal to 1"))
    if old is not None:
        old_spec = mapping(old.get("spec"))
        if "runtimeRef" in old_spec and isinstance(ref, dict) and old_spec.get("runtimeRef") != ref:
            errors.append(cel_error("spec.runtimeRef", ref, names.MESSAGE_RUNTIME_REF_IMMUTABLE))
        if "managedBy" in old_spec and managed_by is not None and old_spec.get("managedBy") != managed_by:
            errors.append(cel_error("spec.managedBy", managed_by, names.MESSAGE_MANAGED_BY_IMMUTABLE))
        errors.extend(_v23_immutability_errors(spec, old_spec))
    return errors


def _v23_immutability_errors(spec: dict[str, Any], old_spec: dict[str, Any]) -> list[FieldError]:
    """v2.3.0's ``self == oldSelf`` rules (transition rules: only where both sides exist)."""
    errors: list[FieldError] = []
    for key in ("initializer", "activeDeadlineSeconds"):
        if key in old_spec and key in spec and old_spec[key] != spec[key]:
            errors.append(cel_error(f"spec.{key}", spec[key], c.MESSAGE_FIELD_IMMUTABLE))
    trainer, old_trainer = spec.get("trainer"), old_spec.get("trainer")
    if isinstance(trainer, dict) and isinstance(old_trainer, dict) and any(
            trainer.get(key) != old_trainer.get(key) for key in c.TRAINER_IMMUTABLE_FIELDS):
        # trainyard: numNodes is left to the webhook (elastic runtimes may change it).
        errors.append(cel_error("spec.trainer", trainer, c.MESSAGE_FIELD_IMMUTABLE))
    old_patches = {mapping(p).get("manager"): mapping(p) for p in items(old_spec.get("runtimePatches"))}
    for index, patch in enumerate(items(spec.get("runtimePatches"))):
        before = old_patches.get(mapping(patch).get("manager"))
        if before is None:
            continue
        old_jobs = {mapping(j).get("name"): mapping(j) for j in
                    items(dig(before, "trainingRuntimeSpec", "template", "spec", "replicatedJobs"))}
        jobs = items(dig(patch, "trainingRuntimeSpec", "template", "spec", "replicatedJobs"))
        for j_index, job in enumerate(jobs):
            old_job = old_jobs.get(mapping(job).get("name"))
            if old_job is None:
                continue
            pod, old_pod = (mapping(dig(x, "template", "spec", "template", "spec")) for x in (job, old_job))
            for key in _PATCH_IMMUTABLE_POD_FIELDS:
                if key in pod and key in old_pod and pod[key] != old_pod[key]:
                    errors.append(cel_error(
                        f"spec.runtimePatches[{index}].trainingRuntimeSpec.template.spec.replicatedJobs[{j_index}]"
                        f".template.spec.template.spec.{key}", pod[key], c.MESSAGE_FIELD_IMMUTABLE))
    return errors


def validate_trainjob(new: Any, old: Any | None = None, runtime: Any | None = None,
                      observed: Iterable[Any] | ObservedState = (), *,
                      schema_check: SchemaCheck | None = model_schema_errors,
                      plugins: Sequence[Plugin] = REGISTRY) -> ValidationResult:
    """Admission of a TrainJob create (``old`` None) or update.

    ``runtime`` is the referenced runtime; when None it is looked up in ``observed``, which
    also holds the objects the rules read (existing JobSet, PriorityClasses).
    ``schema_check`` adds type errors; by default those of the API models.
    """
    new_doc = trainjob_with_defaults(as_document(new))
    old_doc = trainjob_with_defaults(as_document(old)) if old is not None else None
    state = observed if isinstance(observed, ObservedState) else ObservedState.of(observed)
    schema = _schema_errors(new_doc, old_doc, trainjob_schema_errors, schema_check)
    if schema:
        return ValidationResult(code=422, errors=schema, webhook=TRAINJOB_WEBHOOK)
    result = ValidationResult(webhook=TRAINJOB_WEBHOOK)
    unsupported = unsupported_runtime_message(new_doc)
    if unsupported is not None:
        result.code, result.plain_errors = 403, [unsupported]
        return result
    kind = SUPPORTED_KEYS[registry_key(new_doc)]
    try:
        document = as_document(runtime) if runtime is not None else lookup_runtime(new_doc, state)
    except RuntimeLookupError as err:
        result.code, result.errors = 403, [err.field_error(dig(new_doc, "spec", "runtimeRef"))]
        return result
    resolved = ResolvedRuntime(kind, runtime_with_defaults(document))
    if kind == names.CLUSTER_TRAINING_RUNTIME_KIND and is_deprecated(resolved.document):
        result.warnings.append(referenced_deprecation_warning(resolved.name))
    try:
        info = build_info(new_doc, resolved.spec)
    except (PlanningError, QuantityError) as err:
        result.code, result.errors = 403, [internal("spec.podTemplateOverrides", str(err))]
        return result
    result.errors.extend(num_nodes_change_errors(new_doc, old_doc, resolved.spec))
    verdict = run_validation(plugins, ValidationContext(new_doc, old_doc, resolved, info, state))
    result.warnings.extend(verdict.warnings)
    result.errors.extend(verdict.errors)
    if result.errors:
        result.code = 403
    return result


def num_nodes_change_errors(new: dict[str, Any], old: dict[str, Any] | None,
                           runtime_spec: dict[str, Any]) -> list[FieldError]:
    """The other half of trainyard's ``spec.trainer`` rule: ``numNodes`` may change only when
    the runtime is elastic (torch ``elasticPolicy``), with v2.3.0's path and message."""
    if old is None:
        return []
    trainer, old_trainer = dig(new, "spec", "trainer"), dig(old, "spec", "trainer")
    if not isinstance(trainer, dict) or not isinstance(old_trainer, dict) \
            or trainer.get("numNodes") == old_trainer.get("numNodes"):
        return []
    if isinstance(dig(runtime_spec, "mlPolicy", "torch", "elasticPolicy"), dict):
        return []
    return [invalid("spec.trainer", trainer, c.MESSAGE_FIELD_IMMUTABLE)]


# --- Runtimes -----------------------------------------------------------------------------

_JOBSET_IMMUTABLE_FIELDS = ("failurePolicy", "network", "startupPolicy", "successPolicy")


def runtime_schema_errors(new: dict[str, Any], old: dict[str, Any] | None) -> list[FieldError]:
    """The runtime CRDs' structural and CEL rules (§1.2) on a defaulted object."""
    errors: list[FieldError] = []
    if not dig(new, "metadata", "name"):
        errors.append(FieldError(ErrorType.REQUIRED, "metadata.name", detail="name or generateName is required"))
    spec = new.get("spec")
    if not isinstance(spec, dict):
        return errors
    if not spec:
        errors.append(invalid("spec", 0, "spec in body should have at least 1 properties"))
    ml_policy = spec.get("mlPolicy")
    if isinstance(ml_policy, dict):
        torch, mpi = ml_policy.get("torch"), ml_policy.get("mpi")
        if "numNodes" in ml_policy and isinstance(torch, dict) and "elasticPolicy" in torch:
            errors.append(cel_error("spec.mlPolicy", ml_policy,
                                    names.MESSAGE_NUM_NODES_WITH_ELASTIC))
        # v2.3.0's rule: at most one of the five sources.
        if sum(1 for key in ("torch", "mpi", "jax", "xgboost", "flux") if key in ml_policy) > 1:
            errors.append(cel_error("spec.mlPolicy", ml_policy, names.MESSAGE_ONE_POLICY))
        flux_nproc = dig(ml_policy, "flux", "numProcPerNode")
        if isinstance(flux_nproc, int) and flux_nproc < 1:
            errors.append(cel_error("spec.mlPolicy.flux.numProcPerNode", flux_nproc, c.MESSAGE_FLUX_NUM_PROC_PER_NODE))
        for t_index, target in enumerate(items(dig(torch, "envInjection", "targets"))):
            container_names = mapping(target).get("containerNames")
            if isinstance(container_names, list) and names.NODE in container_names:
                errors.append(cel_error(f"spec.mlPolicy.torch.envInjection.targets[{t_index}].containerNames",
                                        container_names, c.MESSAGE_ENV_INJECTION_NODE))
        if isinstance(torch, dict) and "numProcPerNode" in torch:
            nproc = torch["numProcPerNode"]
            valid = (isinstance(nproc, int) and not isinstance(nproc, bool) and nproc > 0) or nproc in ("auto", "cpu", "gpu")
            if not valid:
                errors.append(cel_error("spec.mlPolicy.torch.numProcPerNode", nproc,
                                        names.MESSAGE_NUM_PROC_PER_NODE))
        if isinstance(mpi, dict) and mpi.get("mpiImplementation") not in (None, names.MPI_OPENMPI, ""):
            errors.append(not_supported("spec.mlPolicy.mpi.mpiImplementation", mpi.get("mpiImplementation"),
                                        [names.MPI_OPENMPI, ""]))
    topology = dig(spec, "podGroupPolicy", "volcano", "networkTopology")
    if isinstance(topology, dict) and topology.get("mode") not in (None, "hard", "soft"):
        errors.append(not_supported("spec.podGroupPolicy.volcano.networkTopology.mode", topology.get("mode"),
                                    ["hard", "soft"]))
    template = spec.get("template")
    if isinstance(template, dict) and not template:
        errors.append(invalid("spec.template", 0, "spec.template in body should have at least 1 properties"))
    jobset_spec = mapping(dig(spec, "template", "spec"))
    errors.extend(_jobset_spec_errors(jobset_spec))
    if old is not None:
        old_jobset = mapping(dig(old, "spec", "template", "spec"))
        for key in _JOBSET_IMMUTABLE_FIELDS:
            if key in old_jobset and key in jobset_spec and old_jobset[key] != jobset_spec[key]:
                errors.append(cel_error(f"spec.template.spec.{key}", jobset_spec[key], names.MESSAGE_VALUE_IMMUTABLE))
        old_jobs = {mapping(j).get("name"): mapping(j) for j in items(old_jobset.get("replicatedJobs"))}
        for index, job in enumerate(items(jobset_spec.get("replicatedJobs"))):
            before = old_jobs.get(mapping(job).get("name"))
            if before and "dependsOn" in before and "dependsOn" in mapping(job) \
                    and before["dependsOn"] != job["dependsOn"]:
                errors.append(cel_error(f"spec.template.spec.replicatedJobs[{index}].dependsOn",
                                        job["dependsOn"], names.MESSAGE_VALUE_IMMUTABLE))
    return errors


def _jobset_spec_errors(jobset_spec: dict[str, Any]) -> list[FieldError]:
    errors: list[FieldError] = []
    base = "spec.template.spec"
    jobs = items(jobset_spec.get("replicatedJobs"))
    order = dig(jobset_spec, "startupPolicy", "startupPolicyOrder")
    if order == "InOrder" and any(isinstance(j, dict) and "dependsOn" in j for j in jobs):
        errors.append(cel_error(base, jobset_spec, names.MESSAGE_STARTUP_DEPENDS_ON))
    if order is not None and order not in ("AnyOrder", "InOrder"):
        errors.append(not_supported(f"{base}.startupPolicy.startupPolicyOrder", order, ["AnyOrder", "InOrder"]))
    operator = dig(jobset_spec, "successPolicy", "operator")
    if operator is not None and operator not in ("All", "Any"):
        errors.append(not_supported(f"{base}.successPolicy.operator", operator, ["All", "Any"]))
    ttl = jobset_spec.get("ttlSecondsAfterFinished")
    if isinstance(ttl, int) and ttl < 0:
        errors.append(invalid(f"{base}.ttlSecondsAfterFinished", ttl,
                              f"{base}.ttlSecondsAfterFinished in body should be greater than or equal to 0"))
    actions = ["FailJobSet", "RestartJobSet", "RestartJobSetAndIgnoreMaxRestarts"]
    for index, rule in enumerate(items(dig(jobset_spec, "failurePolicy", "rules"))):
        action = mapping(rule).get("action")
        if action not in actions:
            errors.append(not_supported(f"{base}.failurePolicy.rules[{index}].action", action, actions))
    seen: set[Any] = set()
    for index, job in enumerate(jobs):
        job = mapping(job)
        path = f"{base}.replicatedJobs[{index}]"
        name = job.get("name")
        if not name or not isinstance(name, str):
            errors.append(FieldError(ErrorType.REQUIRED, f"{path}.name"))
        elif name in seen:
            errors.append(FieldError(ErrorType.DUPLICATE, f"{path}", {"name": name}))
        else:
            seen.add(name)
        depends_on = items(job.get("dependsOn"))
        if len(depends_on) > 5:
            errors.append(FieldError(ErrorType.TOO_MANY, f"{path}.dependsOn", len(depends_on),
                                     "must have at most 5 items"))
        for d_index, dependency in enumerate(depends_on):
            status = mapping(dependency).get("status")
            if status not in ("Ready", "Complete"):
                errors.append(not_supported(f"{path}.dependsOn[{d_index}].status", status, ["Ready", "Complete"]))
    return errors


def replicated_job_errors(runtime: dict[str, Any]) -> list[FieldError]:
    """The runtime webhooks' replicated-job rules (§6.4)."""
    errors: list[FieldError] = []
    for index, job in enumerate(items(dig(runtime, "spec", "template", "spec", "replicatedJobs"))):
        job = mapping(job)
        labels = dig(job, "template", "metadata", "labels")
        if not isinstance(labels, dict) or labels.get(names.LABEL_ANCESTOR) not in _ANCESTOR_CONTAINERS:
            continue
        ancestor = labels[names.LABEL_ANCESTOR]
        path = f"spec.template.spec.replicatedJobs[{index}]"
        replicas = job.get("replicas", 1)
        if replicas != 1:
            errors.append(invalid(f"{path}.replicas", replicas, c.ERR_ALWAYS_ONE))
        containers = items(dig(job, "template", "spec", "template", "spec", "containers"))
        if not any(mapping(c).get("name") == _ANCESTOR_CONTAINERS[ancestor] for c in containers):
            errors.append(invalid(f"{path}.template.spec.template.spec.containers", containers,
                                  f"{c.ERR_MISSING_ANCESTOR_CONTAINER}{ancestor}"))
    return errors


def validate_runtime(new: Any, old: Any | None = None, *,
                     schema_check: SchemaCheck | None = model_schema_errors) -> ValidationResult:
    """Admission of a TrainingRuntime / ClusterTrainingRuntime create (``old`` None) or update."""
    new_doc = runtime_with_defaults(as_document(new))
    old_doc = runtime_with_defaults(as_document(old)) if old is not None else None
    kind = str(new_doc.get("kind") or "")
    webhook = CLUSTER_TRAINING_RUNTIME_WEBHOOK if kind == names.CLUSTER_TRAINING_RUNTIME_KIND \
        else TRAINING_RUNTIME_WEBHOOK
    schema = _schema_errors(new_doc, old_doc, runtime_schema_errors, schema_check)
    if schema:
        return ValidationResult(code=422, errors=schema, webhook=webhook)
    result = ValidationResult(webhook=webhook)
    if kind == names.TRAINING_RUNTIME_KIND and old_doc is not None:
        return result  # the TrainingRuntime webhook does not validate updates
    if kind == names.CLUSTER_TRAINING_RUNTIME_KIND and old_doc is None and is_deprecated(new_doc):
        result.warnings.append(created_deprecation_warning(str(dig(new_doc, "metadata", "name") or "")))
    result.errors = replicated_job_errors(new_doc)
    if result.errors:
        result.code = 403
    return result
