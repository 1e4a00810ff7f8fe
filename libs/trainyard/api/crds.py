"""CustomResourceDefinitions generated from the API models.

Trainer, JobSet and PodGroup types get their schema from the model fields (types, required,
descriptions, enums from ``Literal``, ``server_default``, CEL rules, list types). Built-in
Kubernetes types (models with ``k8s_definition``) are inlined from the pinned Kubernetes 1.36
OpenAPI definitions and converted to structural CRD schemas. Output is deterministic.
"""
from __future__ import annotations

import copy
import functools
import json
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, Union

from trainyard.api.jobset import JobSet
from trainyard.api.meta import (
    SERVER_DEFAULT,
    IntOrStringMarker,
    KubeModel,
    KubeObject,
    ObjectMeta,
    QuantityMarker,
    SchemaFormat,
)
from trainyard.api import constants as c
from trainyard.api.multikueue import MultiKueueCluster
from trainyard.api.scheduling import CoschedulingPodGroup, VolcanoPodGroup, VolcanoQueue
from trainyard.api.trainer import ClusterTrainingRuntime, TrainingRuntime, TrainJob
from trainyard.apimachinery.openapi_definitions import KUBERNETES_VERSION, definition, ref_name
from trainyard.compat import TrainerCompat

Schema = dict[str, Any]

QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?"
    r"(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
_OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
_CONDITION = "io.k8s.apimachinery.pkg.apis.meta.v1.Condition"
_SPECIAL_DEFINITIONS: dict[str, Schema] = {
    "io.k8s.apimachinery.pkg.api.resource.Quantity": {
        "anyOf": [{"type": "integer"}, {"type": "string"}],
        "pattern": QUANTITY_PATTERN,
        "x-kubernetes-int-or-string": True,
    },
    "io.k8s.apimachinery.pkg.util.intstr.IntOrString": {
        "anyOf": [{"type": "integer"}, {"type": "string"}],
        "x-kubernetes-int-or-string": True,
    },
    "io.k8s.apimachinery.pkg.apis.meta.v1.Time": {"type": "string", "format": "date-time"},
    "io.k8s.apimachinery.pkg.apis.meta.v1.MicroTime": {"type": "string", "format": "date-time"},
}
# Kubernetes validation markers (``+default``, ``+structType``, ``+kubebuilder:validation``)
# that the JSON definitions drop but CRD schemas carry, keyed by (definition, property);
# property None means the object itself. List-map keys must be required or defaulted.
_CORE = "io.k8s.api.core.v1."
_NAME_DEFAULTS_EMPTY = (
    "LocalObjectReference",
    "ConfigMapKeySelector",
    "SecretKeySelector",
    "ConfigMapEnvSource",
    "SecretEnvSource",
    "ConfigMapVolumeSource",
    "ConfigMapProjection",
    "SecretProjection",
)
_KUBERNETES_MARKERS: dict[tuple[str, str | None], Schema] = {
    **{(_CORE + name, "name"): {"default": ""} for name in _NAME_DEFAULTS_EMPTY},
    **{
        (_CORE + name, None): {"x-kubernetes-map-type": "atomic"}
        for name in ("ConfigMapEnvSource", "SecretEnvSource", "ConfigMapVolumeSource", "ConfigMapProjection", "SecretProjection")
    },
    (_CORE + "ContainerPort", "protocol"): {"default": "TCP"},
    (_CORE + "FileKeySelector", "optional"): {"default": False},
    (_CORE + "GRPCAction", "service"): {"default": ""},
    (_CORE + "AzureDiskVolumeSource", "fsType"): {"default": "ext4"},
    (_CORE + "AzureDiskVolumeSource", "readOnly"): {"default": False},
    (_CORE + "ISCSIVolumeSource", "iscsiInterface"): {"default": "default"},
    (_CORE + "RBDVolumeSource", "keyring"): {"default": "/etc/ceph/keyring"},
    (_CORE + "RBDVolumeSource", "pool"): {"default": "rbd"},
    (_CORE + "RBDVolumeSource", "user"): {"default": "admin"},
    (_CORE + "ScaleIOVolumeSource", "fsType"): {"default": "xfs"},
    (_CORE + "ScaleIOVolumeSource", "storageMode"): {"default": "ThinProvisioned"},
    (_CONDITION, "type"): {
        "maxLength": 316,
        "pattern": r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$",
    },
    (_CONDITION, "status"): {"enum": ["True", "False", "Unknown"]},
    (_CONDITION, "reason"): {
        "minLength": 1,
        "maxLength": 1024,
        "pattern": r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$",
    },
    (_CONDITION, "message"): {"maxLength": 32768},
    (_CONDITION, "observedGeneration"): {"minimum": 0},
}
# Schema keywords of the Kubernetes definitions that a CRD schema may carry.
_KEPT_KEYWORDS = (
    "description",
    "format",
    "enum",
    "default",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "pattern",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-map-type",
)


def embedded_object_meta() -> Schema:
    """The metadata schema of an embedded template (what controller-gen emits)."""
    return {
        "description": "Metadata of the objects created from this template: name, namespace,"
        " labels, annotations and finalizers.",
        "type": "object",
        "properties": {
            "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
            "finalizers": {"type": "array", "items": {"type": "string"}},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            "name": {"type": "string"},
            "namespace": {"type": "string"},
        },
    }


# --- Kubernetes definitions -> structural schema ---------------------------------------------


def _structural_type(raw: Any) -> str | None:
    if isinstance(raw, list):
        kinds = [kind for kind in raw if kind != "null"]
        return kinds[0] if kinds else None
    return raw


@functools.cache
def kubernetes_schema(name: str) -> Schema:
    """The structural CRD schema of a Kubernetes definition, all ``$ref`` inlined."""
    return _convert_definition(name, ())


def _convert_definition(name: str, stack: tuple[str, ...]) -> Schema:
    if name in _SPECIAL_DEFINITIONS:
        return dict(_SPECIAL_DEFINITIONS[name])
    if name == _OBJECT_META and stack:
        return embedded_object_meta()
    if name in stack:  # a recursive type: keep whatever is there
        return {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    return _convert_node(definition(name), (*stack, name), name)


def _convert_node(node: Schema, stack: tuple[str, ...], owner: str | None = None) -> Schema:
    if "$ref" in node:
        converted = _convert_definition(ref_name(node["$ref"]), stack)
        if "description" in node:
            converted = {**converted, "description": node["description"]}
        return converted
    out: Schema = {key: node[key] for key in _KEPT_KEYWORDS if key in node}
    kind = _structural_type(node.get("type"))
    if kind is None:  # untyped in Kubernetes (e.g. JSON): accept anything
        out.update({"type": "object", "x-kubernetes-preserve-unknown-fields": True})
        return out
    out["type"] = kind
    if kind == "object":
        properties = node.get("properties")
        additional = node.get("additionalProperties")
        if properties:
            out["properties"] = {
                key: _with_markers(owner, key, _convert_node(value, stack))
                for key, value in properties.items()
            }
        if isinstance(additional, dict):
            out["additionalProperties"] = _convert_node(additional, stack)
        if not properties and not isinstance(additional, dict):
            out["x-kubernetes-preserve-unknown-fields"] = True
        if node.get("required"):
            out["required"] = sorted(node["required"])
        out = _with_markers(owner, None, out)
    elif kind == "array" and isinstance(node.get("items"), dict):
        out["items"] = _convert_node(node["items"], stack)
    return out


def _with_markers(owner: str | None, key: str | None, schema: Schema) -> Schema:
    markers = _KUBERNETES_MARKERS.get((owner, key)) if owner else None
    return {**schema, **markers} if markers else schema


# --- models -> structural schema ---------------------------------------------------------------


def _without_none(annotation: Any) -> Any:
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        members = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        if len(members) == 1:
            return members[0]
    return annotation


def type_schema(annotation: Any, metadata: list[Any] | tuple[Any, ...] = ()) -> Schema:
    """The structural schema of a field type (``metadata``: its ``Annotated`` extras)."""
    annotation = _without_none(annotation)
    if typing.get_origin(annotation) is typing.Annotated:
        base, *extras = typing.get_args(annotation)
        return type_schema(base, [*metadata, *extras])
    for marker in metadata:
        if isinstance(marker, QuantityMarker):
            return dict(_SPECIAL_DEFINITIONS["io.k8s.apimachinery.pkg.api.resource.Quantity"])
        if isinstance(marker, IntOrStringMarker):
            return dict(_SPECIAL_DEFINITIONS["io.k8s.apimachinery.pkg.util.intstr.IntOrString"])
    schema = _plain_type_schema(annotation)
    for marker in metadata:
        if isinstance(marker, SchemaFormat):
            schema["format"] = marker.format
    return schema


def _plain_type_schema(annotation: Any) -> Schema:
    origin = typing.get_origin(annotation)
    if origin is Literal:
        values = list(typing.get_args(annotation))
        return {"type": "string", "enum": values}
    if origin is list:
        (item,) = typing.get_args(annotation)
        return {"type": "array", "items": type_schema(item)}
    if origin is dict:
        _, value = typing.get_args(annotation)
        if value is Any:
            return {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
        return {"type": "object", "additionalProperties": type_schema(value)}
    if isinstance(annotation, type) and issubclass(annotation, KubeModel):
        return model_schema(annotation)
    scalar = {bool: "boolean", int: "integer", float: "number", str: "string"}.get(annotation)
    if scalar:
        return {"type": scalar}
    return {"type": "object", "x-kubernetes-preserve-unknown-fields": True}


def field_schema(info: Any) -> Schema:
    """Schema of one model field: its type plus the facts declared with ``crd_field``."""
    # A copy: schemas of built-in types are cached and shared.
    schema = dict(type_schema(info.annotation, info.metadata))
    if info.description:
        schema["description"] = info.description
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    for key, value in extra.items():
        if key == SERVER_DEFAULT:
            schema["default"] = value
        elif key == "items_schema":  # facts about each list item (e.g. its maxLength)
            schema["items"] = {**schema.get("items", {}), **value}
        else:
            schema[key] = value
    return schema


def model_schema(model: type[KubeModel]) -> Schema:
    """The structural schema of a model (inlined from Kubernetes for built-in types)."""
    if model is ObjectMeta:
        return embedded_object_meta()
    if model.k8s_definition:
        return kubernetes_schema(model.k8s_definition)
    schema: Schema = {"type": "object"}
    if model.__doc__:
        schema["description"] = " ".join(model.__doc__.split())
    properties = {}
    required = []
    for name, info in model.model_fields.items():
        key = info.alias or name
        properties[key] = field_schema(info)
        if info.is_required():
            required.append(key)
    if properties:
        schema["properties"] = properties
    if required:
        schema["required"] = sorted(required)
    schema.update(getattr(model, "crd_schema", {}))
    rules = getattr(model, "crd_rules", None)
    if rules:
        schema["x-kubernetes-validations"] = [{"message": msg, "rule": rule} for rule, msg in rules]
    return schema


def object_schema(model: type[KubeObject]) -> Schema:
    """The top-level schema: apiVersion, kind, metadata and the model's own fields."""
    schema = model_schema(model)
    schema["properties"]["apiVersion"] = {
        "type": "string",
        "description": "Versioned schema of this representation of an object.",
    }
    schema["properties"]["kind"] = {
        "type": "string",
        "description": "REST resource this object represents.",
    }
    schema["properties"]["metadata"] = {"type": "object"}
    schema.pop("required", None)
    return schema


# --- CRDs ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CrdInfo:
    """Naming, scope and presentation of one CRD."""

    model: type[KubeObject]
    plural: str
    printer_columns: list[dict[str, Any]] = field(default_factory=list)
    short_names: list[str] = field(default_factory=list)
    status_subresource: bool = True
    categories: list[str] = field(default_factory=list)
    # The scale subresource (trainyard: TrainJob, for elastic training; docs/elastic.md).
    scale: dict[str, str] | None = None

    @property
    def group(self) -> str:
        return self.model.API_VERSION.split("/")[0]  # type: ignore[union-attr]

    @property
    def version(self) -> str:
        return self.model.API_VERSION.split("/")[1]  # type: ignore[union-attr]

    @property
    def kind(self) -> str:
        return self.model.KIND  # type: ignore[return-value]

    @property
    def name(self) -> str:
        return f"{self.plural}.{self.group}"

    @property
    def file_name(self) -> str:
        return f"{self.group}_{self.plural}.yaml"


def _column(name: str, json_path: str, kind: str = "string", description: str = "", priority: int = 0) -> dict[str, Any]:
    column: dict[str, Any] = {"name": name, "type": kind, "jsonPath": json_path}
    if description:
        column["description"] = description
    if priority:
        column["priority"] = priority
    return column


_AGE = _column("Age", ".metadata.creationTimestamp", "date")
_RUNTIME_COLUMNS = [
    _column("Framework", ".metadata.labels.trainer\\.kubeflow\\.org/framework", description="Training framework"),
    _column("Deprecated", ".metadata.labels.trainer\\.kubeflow\\.org/support", priority=1),
    _AGE,
]

CRDS: tuple[CrdInfo, ...] = (
    CrdInfo(
        TrainJob,
        "trainjobs",
        printer_columns=[
            _column("State", ".status.conditions[-1:].type"),
            # trainyard: never blank (Running/Suspended/Complete/Failed); upstream's State is
            # the last condition's type, empty while a TrainJob runs.
            _column("Status", ".status.state", description="Running, Suspended, Complete or Failed"),
            _column("Runtime", ".spec.runtimeRef.name", description="Referenced runtime"),
            # trainyard: v2.3.0's progress report (TrainJobStatus), shown while it trains.
            _column("Progress", ".status.trainerStatus.progressPercentage", "integer",
                    description="Training progress in percent, as the trainer reports it"),
            _column("Suspended", ".spec.suspend", "boolean", priority=1),
            # trainyard: the worker cluster a delegated TrainJob runs on (the dispatcher's annotation).
            _column("Cluster", ".metadata.annotations.trainyard\\.kubeflow\\.org/worker-cluster",
                    description="Worker cluster running a delegated TrainJob", priority=1),
            _AGE,
        ],
        categories=["trainyard"],
        # trainyard: kubectl scale / an HPA resize an elastic TrainJob (docs/elastic.md).
        scale={"specReplicasPath": ".spec.trainer.numNodes", "statusReplicasPath": ".status.elastic.currentNodes",
               "labelSelectorPath": ".status.elastic.selector"},
    ),
    CrdInfo(TrainingRuntime, "trainingruntimes", _RUNTIME_COLUMNS, status_subresource=False, categories=["trainyard"]),
    CrdInfo(ClusterTrainingRuntime, "clustertrainingruntimes", _RUNTIME_COLUMNS, status_subresource=False, categories=["trainyard"]),
    CrdInfo(
        JobSet,
        "jobsets",
        printer_columns=[
            _column("TerminalState", ".status.terminalState", description="Final state of the JobSet"),
            _column("Restarts", ".status.restarts", description="Number of restarts"),
            _column("Completed", '.status.conditions[?(@.type=="Completed")].status'),
            _column("Suspended", ".spec.suspend", description="Whether the JobSet is suspended"),
            _AGE,
        ],
    ),
    CrdInfo(
        CoschedulingPodGroup,
        "podgroups",
        short_names=["pg", "pgs"],
        printer_columns=[
            _column("Phase", ".status.phase"),
            _column("MinMember", ".spec.minMember", "integer"),
            _column("Running", ".status.running", "integer"),
            _column("Succeeded", ".status.succeeded", "integer"),
            _column("Failed", ".status.failed", "integer"),
            _AGE,
        ],
    ),
    CrdInfo(
        VolcanoPodGroup,
        "podgroups",
        short_names=["pg", "podgroup-v1beta1"],
        status_subresource=False,
        printer_columns=[
            _column("STATUS", ".status.phase"),
            _column("minMember", ".spec.minMember", "integer"),
            _column("RUNNINGS", ".status.running", "integer"),
            _column("AGE", ".metadata.creationTimestamp", "date"),
            _column("QUEUE", ".spec.queue", priority=1),
        ],
    ),
    CrdInfo(
        VolcanoQueue,
        "queues",
        short_names=["q", "queue-v1beta1"],
        printer_columns=[_column("PARENT", ".spec.parent")],
    ),
)


# Kueue's worker-cluster declaration, installed only on a manager cluster without Kueue (Kueue's
# own CRD wins where it exists), so it is kept apart from CRDS: deploy/multicluster/crds.
MULTICLUSTER_CRDS: tuple[CrdInfo, ...] = (
    CrdInfo(
        MultiKueueCluster,
        "multikueueclusters",
        printer_columns=[
            _column("Active", '.status.conditions[?(@.type=="Active")].status',
                    description="Whether the worker cluster is reachable"),
            _column("Reason", '.status.conditions[?(@.type=="Active")].reason', priority=1),
            _column("Message", '.status.conditions[?(@.type=="Active")].message', priority=1),
            _AGE,
        ],
    ),
)


def generate_crd(info: CrdInfo) -> dict[str, Any]:
    """One CustomResourceDefinition document."""
    version: dict[str, Any] = {
        "name": info.version,
        "served": True,
        "storage": True,
        "schema": {"openAPIV3Schema": object_schema(info.model)},
    }
    if info.printer_columns:
        version["additionalPrinterColumns"] = info.printer_columns
    if info.status_subresource:
        version["subresources"] = {"status": {}}
    if info.scale is not None:
        version.setdefault("subresources", {})["scale"] = dict(info.scale)
    names: dict[str, Any] = {
        "kind": info.kind,
        "listKind": f"{info.kind}List",
        "plural": info.plural,
        "singular": info.kind.lower(),
    }
    if info.short_names:
        names["shortNames"] = info.short_names
    if info.categories:
        names["categories"] = info.categories
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": info.name,
            "annotations": {
                "trainyard.kubeflow.org/generated-by": "trainyard crds",
                "trainyard.kubeflow.org/kubernetes-version": KUBERNETES_VERSION.lstrip("v"),
            },
        },
        "spec": {
            "group": info.group,
            "names": names,
            "scope": "Namespaced" if info.model.NAMESPACED else "Cluster",
            "versions": [version],
        },
    }
    # A deep copy through JSON: no shared sub-trees (YAML anchors) and plain JSON types only.
    return json.loads(json.dumps(crd))


def generate_crds() -> list[dict[str, Any]]:
    """Every CRD trainyard serves or writes objects of, in a fixed order."""
    return [generate_crd(info) for info in CRDS]


# Kubeflow Trainer v2.1.0's rule messages where v2.3.0 says "field is immutable" (same rules):
# (CRD name, property path under the root schema, rule) -> message.
V2_1_MESSAGES: dict[tuple[str, tuple[str, ...], str], str] = {
    ("trainjobs.trainer.kubeflow.org", ("spec", "runtimeRef"), "self == oldSelf"): c.MESSAGE_RUNTIME_REF_IMMUTABLE,
    ("trainjobs.trainer.kubeflow.org", ("spec", "managedBy"), "self == oldSelf"): c.MESSAGE_MANAGED_BY_IMMUTABLE,
}


def crds_at(compat: TrainerCompat, crds: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The CRDs (generated, or ``crds``) with the rule messages of that compatibility level:
    v2.3 as generated, v2.1 with v2.1.0's messages (copies; the input is left alone)."""
    crds = generate_crds() if crds is None else crds
    if compat.v2_3:
        return crds
    changed = []
    for crd in crds:
        wanted = {key: message for key, message in V2_1_MESSAGES.items() if key[0] == crd["metadata"]["name"]}
        if not wanted:
            changed.append(crd)
            continue
        crd = copy.deepcopy(crd)
        for version in crd["spec"]["versions"]:
            for (_, path, rule), message in wanted.items():
                node = version["schema"]["openAPIV3Schema"]
                for name in path:
                    node = node["properties"][name]
                for validation in node.get("x-kubernetes-validations", []):
                    if validation.get("rule") == rule:
                        validation["message"] = message
        changed.append(crd)
    return changed


def crd_file_names(infos: tuple[CrdInfo, ...] = CRDS) -> dict[str, dict[str, Any]]:
    """``{file name: CRD}`` as written by ``trainyard crds --out DIR``."""
    return {info.file_name: generate_crd(info) for info in infos}


