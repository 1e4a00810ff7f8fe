"""core/v1 types, typed to the depth trainyard reads and writes.

Fields not listed here are kept verbatim as extra data (see :class:`KubeModel`), so a pod
template with probes, security contexts or any newer Kubernetes field round-trips unchanged.
Each model names its Kubernetes OpenAPI definition; generated CRDs inline that definition
(Kubernetes 1.36) rather than a schema derived from these partial models.
"""
from __future__ import annotations

from typing import Any, ClassVar

from trainyard.api.meta import (
    Int32,
    Int64,
    KubeModel,
    KubeObject,
    LocalObjectReference,
    ObjectMeta,
    Quantity,
)

_CORE = "io.k8s.api.core.v1."


class ObjectFieldSelector(KubeModel):
    """Selects a field of the pod (``metadata.name``, an annotation, ...)."""

    k8s_definition: ClassVar[str | None] = _CORE + "ObjectFieldSelector"

    api_version: str | None = None
    field_path: str


class KeySelector(KubeModel):
    """A key of a ConfigMap or Secret (``configMapKeyRef`` / ``secretKeyRef``)."""

    name: str | None = None
    key: str
    optional: bool | None = None


class ConfigMapKeySelector(KeySelector):
    k8s_definition: ClassVar[str | None] = _CORE + "ConfigMapKeySelector"


class SecretKeySelector(KeySelector):
    k8s_definition: ClassVar[str | None] = _CORE + "SecretKeySelector"


class EnvVarSource(KubeModel):
    """Where an environment variable's value comes from."""

    k8s_definition: ClassVar[str | None] = _CORE + "EnvVarSource"

    field_ref: ObjectFieldSelector | None = None
    config_map_key_ref: ConfigMapKeySelector | None = None
    secret_key_ref: SecretKeySelector | None = None


class EnvVar(KubeModel):
    """One environment variable of a container."""

    k8s_definition: ClassVar[str | None] = _CORE + "EnvVar"

    name: str
    value: str | None = None
    value_from: EnvVarSource | None = None


class OptionalNamedReference(LocalObjectReference):
    """A by-name reference to a ConfigMap or Secret that may be marked optional."""

    optional: bool | None = None


class ConfigMapEnvSource(OptionalNamedReference):
    k8s_definition: ClassVar[str | None] = _CORE + "ConfigMapEnvSource"


class SecretEnvSource(OptionalNamedReference):
    k8s_definition: ClassVar[str | None] = _CORE + "SecretEnvSource"


class EnvFromSource(KubeModel):
    """Environment variables taken from every key of a ConfigMap or Secret."""

    k8s_definition: ClassVar[str | None] = _CORE + "EnvFromSource"

    prefix: str | None = None
    config_map_ref: ConfigMapEnvSource | None = None
    secret_ref: SecretEnvSource | None = None


class ContainerPort(KubeModel):
    """A network port exposed by a container."""

    k8s_definition: ClassVar[str | None] = _CORE + "ContainerPort"

    name: str | None = None
    container_port: Int32
    protocol: str | None = None
    host_port: Int32 | None = None


class ResourceRequirements(KubeModel):
    """Compute resources; quantities are kept exactly as written (``2`` or ``"1Gi"``)."""

    k8s_definition: ClassVar[str | None] = _CORE + "ResourceRequirements"

    limits: dict[str, Quantity] | None = None
    requests: dict[str, Quantity] | None = None
    claims: list[dict[str, Any]] | None = None


class VolumeMount(KubeModel):
    """Where a volume is mounted in a container."""

    k8s_definition: ClassVar[str | None] = _CORE + "VolumeMount"

    name: str
    mount_path: str
    sub_path: str | None = None
    read_only: bool | None = None


class SecurityContext(KubeModel):
    """A container's security context (kept untyped; schema inlined from Kubernetes)."""

    k8s_definition: ClassVar[str | None] = _CORE + "SecurityContext"


class PodSecurityContext(KubeModel):
    """A pod's security context (kept untyped; schema inlined from Kubernetes)."""

    k8s_definition: ClassVar[str | None] = _CORE + "PodSecurityContext"


class Container(KubeModel):
    """A container of a pod (or init container)."""

    k8s_definition: ClassVar[str | None] = _CORE + "Container"

    name: str
    image: str | None = None
    image_pull_policy: str | None = None
    command: list[str] | None = None
    args: list[str] | None = None
    working_dir: str | None = None
    env: list[EnvVar] | None = None
    env_from: list[EnvFromSource] | None = None
    ports: list[ContainerPort] | None = None
    resources: ResourceRequirements | None = None
    volume_mounts: list[VolumeMount] | None = None


class KeyToPath(KubeModel):
    """A key of a ConfigMap/Secret projected to a file path in a volume."""

    k8s_definition: ClassVar[str | None] = _CORE + "KeyToPath"

    key: str
    path: str
    mode: Int32 | None = None


class ConfigMapVolumeSource(OptionalNamedReference):
    k8s_definition: ClassVar[str | None] = _CORE + "ConfigMapVolumeSource"

    items: list[KeyToPath] | None = None
    default_mode: Int32 | None = None


class SecretVolumeSource(KubeModel):
    k8s_definition: ClassVar[str | None] = _CORE + "SecretVolumeSource"

    secret_name: str | None = None
    items: list[KeyToPath] | None = None
    default_mode: Int32 | None = None
    optional: bool | None = None


class PersistentVolumeClaimVolumeSource(KubeModel):
    k8s_definition: ClassVar[str | None] = _CORE + "PersistentVolumeClaimVolumeSource"

    claim_name: str
    read_only: bool | None = None


class EmptyDirVolumeSource(KubeModel):
    k8s_definition: ClassVar[str | None] = _CORE + "EmptyDirVolumeSource"

    medium: str | None = None
    size_limit: Quantity | None = None


class Volume(KubeModel):
    """A pod volume; other volume sources are kept as extra data."""

    k8s_definition: ClassVar[str | None] = _CORE + "Volume"

    name: str
    empty_dir: EmptyDirVolumeSource | None = None
    config_map: ConfigMapVolumeSource | None = None
    secret: SecretVolumeSource | None = None
    persistent_volume_claim: PersistentVolumeClaimVolumeSource | None = None


class Toleration(KubeModel):
    k8s_definition: ClassVar[str | None] = _CORE + "Toleration"

    key: str | None = None
    operator: str | None = None
    value: str | None = None
    effect: str | None = None
    toleration_seconds: Int64 | None = None


class Affinity(KubeModel):
    """Pod (anti-)affinity and node affinity rules, kept untyped below the first level."""

    k8s_definition: ClassVar[str | None] = _CORE + "Affinity"

    node_affinity: dict[str, Any] | None = None
    pod_affinity: dict[str, Any] | None = None
    pod_anti_affinity: dict[str, Any] | None = None


class PodSchedulingGate(KubeModel):
    k8s_definition: ClassVar[str | None] = _CORE + "PodSchedulingGate"

    name: str


class PodSpec(KubeModel):
    """The pod specification, typed where the planner reads or writes it."""

    k8s_definition: ClassVar[str | None] = _CORE + "PodSpec"

    init_containers: list[Container] | None = None
    containers: list[Container] | None = None
    volumes: list[Volume] | None = None
    restart_policy: str | None = None
    service_account_name: str | None = None
    node_selector: dict[str, str] | None = None
    affinity: Affinity | None = None
    tolerations: list[Toleration] | None = None
    scheduling_gates: list[PodSchedulingGate] | None = None
    image_pull_secrets: list[LocalObjectReference] | None = None
    scheduler_name: str | None = None
    priority_class_name: str | None = None
    runtime_class_name: str | None = None
    hostname: str | None = None
    subdomain: str | None = None
    overhead: dict[str, Quantity] | None = None


class PodTemplateSpec(KubeModel):
    """Metadata and spec of the pods a Job creates."""

    k8s_definition: ClassVar[str | None] = _CORE + "PodTemplateSpec"

    metadata: ObjectMeta | None = None
    spec: PodSpec | None = None


class ConfigMap(KubeObject):
    """core/v1 ConfigMap (the MPI hostfile)."""

    API_VERSION: ClassVar[str | None] = "v1"
    KIND: ClassVar[str | None] = "ConfigMap"
    k8s_definition: ClassVar[str | None] = _CORE + "ConfigMap"

    data: dict[str, str] | None = None
    binary_data: dict[str, str] | None = None
    immutable: bool | None = None


class Secret(KubeObject):
    """core/v1 Secret (the MPI SSH keys); ``data`` values are base64 text as on the wire."""

    API_VERSION: ClassVar[str | None] = "v1"
    KIND: ClassVar[str | None] = "Secret"
    k8s_definition: ClassVar[str | None] = _CORE + "Secret"

    type: str | None = None
    data: dict[str, str] | None = None
    string_data: dict[str, str] | None = None
    immutable: bool | None = None
