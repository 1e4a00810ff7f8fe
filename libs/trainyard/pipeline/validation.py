"""Admission validation: the CRD schema/CEL rules and the validating webhooks (spec §1, §6).

``validate_trainjob`` and ``validate_runtime`` answer what the API server would: schema
and CEL violations first (HTTP 422, the webhook is not called), then the webhook's
verdict (HTTP 403 when denied, warnings in both cases).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable, Iterable, Sequence

from trainyard.api import constants as c
from trainyard.api.crds import CRDS, crds_at, generate_crd
from trainyard.apimachinery.structural import apply_defaults
from trainyard.apimachinery.structural import validate as validate_schema

from . import elastic
from .defaults import runtime_with_defaults, trainjob_with_defaults
from .documents import as_document, dig, items, mapping
from .errors import ErrorType, FieldError, PlanningError, aggregate_message, forbidden, from_cause, internal, invalid
from trainyard.compat import DEFAULT_COMPAT, TrainerCompat
from .framework import Plugin, ValidationContext, run_validation
from .info import build_info
from .observed import ObservedState
from .plugins import REGISTRY
from trainyard.apimachinery.quantity import QuantityError
from .resolution import (SUPPORTED_KEYS, ResolvedRuntime, RuntimeLookupError, created_deprecation_warning,
                         is_deprecated, lookup_runtime, referenced_deprecation_warning, registry_key,
                         unsupported_runtime_message)

_ANCESTOR_CONTAINERS = {
    c.ANCESTOR_TRAINER: c.NODE,
    c.ANCESTOR_DATASET_INITIALIZER: c.DATASET_INITIALIZER,
    c.ANCESTOR_MODEL_INITIALIZER: c.MODEL_INITIALIZER,
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
            return f'{kind}.{c.TRAINER_API_GROUP} "{name}" is invalid: {body}'
        return f'admission webhook "{self.webhook}" denied the request: {self.message()}'


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

def trainjob_schema_errors(new: dict[str, Any], old: dict[str, Any] | None,
                           compat: TrainerCompat = DEFAULT_COMPAT) -> list[FieldError]:
    """The TrainJob CRD's structural schema and CEL rules (§1.1) on a defaulted object, with
    the rule messages of the CRD that level installs."""
    errors = _name_errors(new)
    for error in crd_errors(new, old, c.TRAIN_JOB_KIND, compat):
        if error.field == "" and not errors:
            # Deviation (docs/compatibility.md row 8): the root name rules are shown on
            # metadata.name with the name as the value, not on the root as "object".
            errors.append(invalid("metadata.name", dig(new, "metadata", "name"),
                                  error.detail.removeprefix('"object": ')))
        elif error.field != "":
            errors.append(error)
    return errors


def _name_errors(new: dict[str, Any]) -> list[FieldError]:
    """The API server's own metadata check (not a CRD rule)."""
    name = dig(new, "metadata", "name")
    if not isinstance(name, str) or not name:
        return [FieldError(ErrorType.REQUIRED, "metadata.name", detail="name or generateName is required")]
    return []


@lru_cache(maxsize=None)
def crd_schema(kind: str, compat: TrainerCompat = DEFAULT_COMPAT) -> dict[str, Any]:
    """The openAPIV3Schema of the generated CRD served for ``kind`` at that compatibility level
    (computed once each, and only that kind's CRD generated: all of them, JobSet's pod template
    included, took a planner's start a third of a second for each kind)."""
    for crd in crds_at(compat, [generate_crd(info) for info in CRDS if info.kind == kind]):
        if crd["spec"]["names"]["kind"] == kind:
            return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    raise KeyError(kind)


# The kinds whose admission the planner's webhooks answer.
ADMITTED_KINDS = ("TrainJob", "TrainingRuntime", "ClusterTrainingRuntime")


def prepare_admission(compat: TrainerCompat = DEFAULT_COMPAT) -> int:
    """Does once, now, what the first admission request would otherwise pay for: the CRD
    schemas generated and every ``x-kubernetes-validations`` rule in them compiled (cel-python
    builds its parser on first use). About 0.7 s of CPU, which on a busy machine made the first
    webhook call of a fresh planner outlast the API server's 10 s webhook timeout ("failed
    calling webhook ... context deadline exceeded"). Returns the number of rules compiled."""
    from trainyard.apimachinery.cel import compile_rule

    rules = 0
    for kind in ADMITTED_KINDS:
        for rule in schema_rules(crd_schema(kind, compat)):
            compile_rule(rule)
            rules += 1
    return rules


def schema_rules(schema: Any) -> Iterable[str]:
    """Every ``x-kubernetes-validations`` rule of an openAPIV3Schema, nested ones included."""
    if isinstance(schema, dict):
        for rule_spec in schema.get("x-kubernetes-validations") or []:
            if isinstance(rule_spec, dict) and isinstance(rule_spec.get("rule"), str):
                yield rule_spec["rule"]
        for value in schema.values():
            yield from schema_rules(value)
    elif isinstance(schema, list):
        for value in schema:
            yield from schema_rules(value)


def crd_errors(new: dict[str, Any], old: dict[str, Any] | None, kind: str,
               compat: TrainerCompat = DEFAULT_COMPAT) -> list[FieldError]:
    """What the API server's schema validation answers for ``new`` (an update of ``old``): the
    CRD's own schema and ``x-kubernetes-validations``, through the evaluator the devcluster runs
    (``trainyard.apimachinery.structural``), after the CRD's defaults as the server applies them."""
    schema = crd_schema(kind, compat)
    new_doc = apply_defaults(copy.deepcopy(new), schema)
    old_doc = apply_defaults(copy.deepcopy(old), schema) if old is not None else None
    return [from_cause(c["field"], c["reason"], c["message"]) for c in validate_schema(new_doc, old_doc, schema)]


def validate_trainjob(new: Any, old: Any | None = None, runtime: Any | None = None,
                      observed: Iterable[Any] | ObservedState = (), *,
                      schema_check: SchemaCheck | None = model_schema_errors,
                      plugins: Sequence[Plugin] = REGISTRY,
                      compat: TrainerCompat = DEFAULT_COMPAT) -> ValidationResult:
    """Admission of a TrainJob create (``old`` None) or update.

    ``runtime`` is the referenced runtime; when None it is looked up in ``observed``, which
    also holds the objects the rules read (existing JobSet, PriorityClasses).
    ``schema_check`` adds type errors; by default those of the API models. ``compat``: which
    release's behaviour where v2.1.0 and v2.3.0 differ (docs/compatibility.md).
    """
    new_doc = trainjob_with_defaults(as_document(new))
    old_doc = trainjob_with_defaults(as_document(old)) if old is not None else None
    state = observed if isinstance(observed, ObservedState) else ObservedState.of(observed)
    schema = _schema_errors(new_doc, old_doc, lambda n, o: trainjob_schema_errors(n, o, compat), schema_check)
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
    if kind == c.CLUSTER_TRAINING_RUNTIME_KIND and is_deprecated(resolved.document):
        result.warnings.append(referenced_deprecation_warning(resolved.name))
    try:
        info = build_info(new_doc, resolved.spec, compat)
    except (PlanningError, QuantityError) as err:
        result.code, result.errors = 403, [internal("spec.podTemplateOverrides", str(err))]
        return result
    result.errors.extend(num_nodes_change_errors(new_doc, old_doc, resolved.spec))
    result.errors.extend(elastic.num_nodes_errors(new_doc, old_doc, resolved.spec))
    verdict = run_validation(plugins, ValidationContext(new_doc, old_doc, resolved, info, state, compat))
    result.warnings.extend(verdict.warnings)
    result.errors.extend(verdict.errors)
    if result.errors:
        result.code = 403
    return result


def validate_trainjob_scale(scale: dict[str, Any], old_scale: dict[str, Any] | None, trainjob: Any,
                            runtime: Any | None = None,
                            observed: Iterable[Any] | ObservedState = (),
                            compat: TrainerCompat = DEFAULT_COMPAT) -> ValidationResult:
    """Admission of a ``trainjobs/scale`` update (kubectl scale, an HPA): the TrainJob resized to
    the Scale's ``spec.replicas`` is validated as an update of ``spec.trainer.numNodes``; a
    TrainJob whose runtime is not elastic cannot be scaled at all."""
    old_doc = trainjob_with_defaults(as_document(trainjob))
    replicas = dig(scale, "spec", "replicas")
    old_replicas = dig(old_scale or {}, "spec", "replicas")
    if isinstance(old_replicas, int) and isinstance(dig(old_doc, "spec", "trainer"), dict):
        old_doc["spec"]["trainer"]["numNodes"] = old_replicas  # the size this request changes
    new_doc = copy.deepcopy(old_doc)
    new_doc.setdefault("spec", {}).setdefault("trainer", {})["numNodes"] = replicas
    state = observed if isinstance(observed, ObservedState) else ObservedState.of(observed)
    try:
        document = as_document(runtime) if runtime is not None else \
            lookup_runtime(new_doc, state) if unsupported_runtime_message(new_doc) is None else None
    except RuntimeLookupError:
        document = None
    if document is not None and elastic.policy_of(runtime_with_defaults(document).get("spec")) is None:
        name = dig(document, "metadata", "name")
        return ValidationResult(code=403, webhook=TRAINJOB_WEBHOOK, errors=[forbidden(
            elastic.NUM_NODES_FIELD, f"only an elastic TrainJob can be scaled: the runtime {name} has no "
                                     "torch elasticPolicy")])
    return validate_trainjob(new_doc, old_doc, runtime, state, compat=compat)


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

def runtime_schema_errors(new: dict[str, Any], old: dict[str, Any] | None) -> list[FieldError]:
    """The runtime CRDs' structural schema and CEL rules (§1.2) on a defaulted object."""
    # The two runtime CRDs share one schema; any other kind is checked as a TrainingRuntime.
    kind = c.CLUSTER_TRAINING_RUNTIME_KIND if new.get("kind") == c.CLUSTER_TRAINING_RUNTIME_KIND \
        else c.TRAINING_RUNTIME_KIND
    return _name_errors(new) + crd_errors(new, old, kind)


def replicated_job_errors(runtime: dict[str, Any]) -> list[FieldError]:
    """The runtime webhooks' replicated-job rules (§6.4)."""
    errors: list[FieldError] = []
    for index, job in enumerate(items(dig(runtime, "spec", "template", "spec", "replicatedJobs"))):
        job = mapping(job)
        labels = dig(job, "template", "metadata", "labels")
        if not isinstance(labels, dict) or labels.get(c.LABEL_TRAINJOB_ANCESTOR) not in _ANCESTOR_CONTAINERS:
            continue
        ancestor = labels[c.LABEL_TRAINJOB_ANCESTOR]
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
    webhook = CLUSTER_TRAINING_RUNTIME_WEBHOOK if kind == c.CLUSTER_TRAINING_RUNTIME_KIND \
        else TRAINING_RUNTIME_WEBHOOK
    schema = _schema_errors(new_doc, old_doc, runtime_schema_errors, schema_check)
    if schema:
        return ValidationResult(code=422, errors=schema, webhook=webhook)
    result = ValidationResult(webhook=webhook)
    if kind == c.TRAINING_RUNTIME_KIND and old_doc is not None:
        return result  # the TrainingRuntime webhook does not validate updates
    if kind == c.CLUSTER_TRAINING_RUNTIME_KIND and old_doc is None and is_deprecated(new_doc):
        result.warnings.append(created_deprecation_warning(str(dig(new_doc, "metadata", "name") or "")))
    result.errors = replicated_job_errors(new_doc)
    if result.errors:
        result.code = 403
    return result
