"""trainer.kubeflow.org/v1alpha1: TrainJob, TrainingRuntime, ClusterTrainingRuntime.

Every field of upstream v2.1.0 and v2.3.0 is typed here (a superset: fields v2.3.0 dropped,
such as TrainJob ``podTemplateOverrides`` or torch ``elasticPolicy``, are kept). Fields of later
releases are kept verbatim as extra data until they are modelled. ``numProcPerNode`` is
int-or-string and kept as written. Differences: docs/compatibility.md.
"""
from __future__ import annotations

from typing import ClassVar, Literal

from trainyard.api import constants as c
from trainyard.api.core import (
    Affinity,
    EnvVar,
    PodSchedulingGate,
    PodSecurityContext,
    ResourceRequirements,
    SecurityContext,
    Toleration,
    Volume,
    VolumeMount,
)
from trainyard.api.jobset import JobCounts, JobSetSpec
from trainyard.api.meta import (
    Condition,
    DateTime,
    Int32,
    Int64,
    IntOrString,
    KubeModel,
    KubeObject,
    LocalObjectReference,
    ObjectMeta,
    crd_field,
)

_MAP_BY_NAME = {"list_type": "map", "map_keys": ["name"]}
_IMMUTABLE = [("self == oldSelf", c.MESSAGE_FIELD_IMMUTABLE)]


class RuntimeRef(KubeModel):
    """The runtime blueprint a TrainJob is built from."""

    name: str = crd_field(
        "Name of the TrainingRuntime (same namespace) or ClusterTrainingRuntime.",
        required=True,
        minLength=1,
        maxLength=253,
    )
    api_group: str | None = crd_field(
        "API group of the runtime.", server_default=c.TRAINER_API_GROUP, maxLength=253
    )
    kind: str | None = crd_field(
        "Kind of the runtime: TrainingRuntime or ClusterTrainingRuntime.",
        server_default=c.CLUSTER_TRAINING_RUNTIME_KIND,
        maxLength=253,
    )


class InitializerSource(KubeModel):
    """Shared shape of the dataset and model initializers."""

    storage_uri: str | None = crd_field(
        "URI to fetch from; passed to the initializer container as STORAGE_URI.",
        rules=[(c.RULE_STORAGE_URI, c.MESSAGE_STORAGE_URI)],
        maxLength=2048,
    )
    env: list[EnvVar] | None = crd_field(
        "Extra environment variables of the initializer container.", maxItems=128, **_MAP_BY_NAME
    )
    secret_ref: LocalObjectReference | None = crd_field(
        "Secret (same namespace) whose keys become environment variables of the initializer.",
        map_type="atomic",
    )


class DatasetInitializer(InitializerSource):
    """Where the dataset comes from (applies to the dataset-initializer job)."""


class ModelInitializer(InitializerSource):
    """Where the pre-trained model comes from (applies to the model-initializer job)."""


class Initializer(KubeModel):
    """Initializers that prepare data before training."""

    dataset: DatasetInitializer | None = crd_field("Dataset initializer configuration.")
    model: ModelInitializer | None = crd_field("Model initializer configuration.")


class Trainer(KubeModel):
    """Settings of the trainer nodes that override the runtime's trainer container."""

    image: str | None = crd_field("Image of the trainer container (named node).", maxLength=500)
    command: list[str] | None = crd_field(
        "Command of the trainer container; [tune, run] selects TorchTune.", list_type="atomic",
        maxItems=128, items_schema={"maxLength": 1048576},
    )
    args: list[str] | None = crd_field("Arguments of the trainer container.", list_type="atomic",
                                       maxItems=128, items_schema={"maxLength": 1048576})
    env: list[EnvVar] | None = crd_field(
        "Environment variables upserted into the trainer container.", maxItems=128, **_MAP_BY_NAME
    )
    num_nodes: Int32 | None = crd_field("Number of training nodes; overrides mlPolicy.numNodes.")
    resources_per_node: ResourceRequirements | None = crd_field(
        "Compute resources of each training node (replaces the runtime's)."
    )
    num_proc_per_node: IntOrString | None = crd_field(
        "Processes per node: an integer, or auto, cpu or gpu for Torch."
    )


class TargetJob(KubeModel):
    """A replicated job of the runtime template, by name."""

    name: str = crd_field("Name of the replicated job.", required=True, minLength=1)


class ContainerOverride(KubeModel):
    """Changes to one (init)container of the targeted jobs."""

    name: str = crd_field("Name of an existing container.", required=True, minLength=1)
    env: list[EnvVar] | None = crd_field("Environment variables merged by name.", **_MAP_BY_NAME)
    volume_mounts: list[VolumeMount] | None = crd_field(
        "Volume mounts merged into the container.", **_MAP_BY_NAME
    )


class PodTemplateSpecOverride(KubeModel):
    """Pod spec fields a TrainJob may override in targeted jobs."""

    service_account_name: str | None = crd_field("Service account of the pods.")
    node_selector: dict[str, str] | None = crd_field("Node selector merged key by key.")
    affinity: Affinity | None = crd_field("Affinity merged into the pods' affinity.")
    tolerations: list[Toleration] | None = crd_field(
        "Tolerations replacing the pods' tolerations.", list_type="atomic"
    )
    volumes: list[Volume] | None = crd_field("Volumes merged by name.", **_MAP_BY_NAME)
    init_containers: list[ContainerOverride] | None = crd_field(
        "Init container changes, by name.", **_MAP_BY_NAME
    )
    containers: list[ContainerOverride] | None = crd_field(
        "Container changes, by name.", **_MAP_BY_NAME
    )
    scheduling_gates: list[PodSchedulingGate] | None = crd_field(
        "Scheduling gates merged by name.", **_MAP_BY_NAME
    )
    image_pull_secrets: list[LocalObjectReference] | None = crd_field(
        "Image pull secrets merged by name.", **_MAP_BY_NAME
    )


class PodTemplateOverride(KubeModel):
    """Overrides applied to the pod template of some replicated jobs."""

    target_jobs: list[TargetJob] = crd_field(
        "Replicated jobs the override applies to.", required=True, list_type="atomic"
    )
    metadata: ObjectMeta | None = crd_field("Labels and annotations merged into the pods.")
    spec: PodTemplateSpecOverride | None = crd_field("Pod spec overrides.")


class ContainerPatch(KubeModel):
    """Changes a runtime patch makes to one (init)container of a replicated job (v2.3.0)."""

    name: str = crd_field("Name of a container of the runtime job.", required=True, minLength=1,
                          maxLength=253)
    env: list[EnvVar] | None = crd_field("Environment variables merged by name.", maxItems=128,
                                         **_MAP_BY_NAME)
    volume_mounts: list[VolumeMount] | None = crd_field("Volume mounts merged by name.", maxItems=128,
                                                        **_MAP_BY_NAME)
    security_context: SecurityContext | None = crd_field("Security context of the container.")


class PodSpecPatch(KubeModel):
    """The Pod spec fields a runtime patch may set (v2.3.0)."""

    service_account_name: str | None = crd_field("Service account of the pods.", maxLength=253,
                                                 rules=_IMMUTABLE)
    volumes: list[Volume] | None = crd_field("Volumes merged by name.", maxItems=128, rules=_IMMUTABLE,
                                             **_MAP_BY_NAME)
    init_containers: list[ContainerPatch] | None = crd_field(
        "Init container changes, by name.", maxItems=64, rules=_IMMUTABLE, **_MAP_BY_NAME)
    containers: list[ContainerPatch] | None = crd_field(
        "Container changes, by name.", maxItems=64, rules=_IMMUTABLE, **_MAP_BY_NAME)
    image_pull_secrets: list[LocalObjectReference] | None = crd_field(
        "Image pull secrets merged by name.", maxItems=64, rules=_IMMUTABLE, **_MAP_BY_NAME)
    security_context: PodSecurityContext | None = crd_field("Security context of the pods.",
                                                            rules=_IMMUTABLE)
    node_selector: dict[str, str] | None = crd_field("Node selector merged key by key.")
    affinity: Affinity | None = crd_field("Affinity merged into the pods' affinity.")
    tolerations: list[Toleration] | None = crd_field("Tolerations of the pods.", list_type="atomic",
                                                     maxItems=128)
    scheduling_gates: list[PodSchedulingGate] | None = crd_field(
        "Scheduling gates merged by name.", maxItems=16, **_MAP_BY_NAME)
    termination_grace_period_seconds: Int64 | None = crd_field(
        "Termination grace period of the pods.", minimum=0, rules=_IMMUTABLE)


class PodTemplatePatch(KubeModel):
    """Patch of a Job's Pod template: labels, annotations, restricted spec."""

    metadata: ObjectMeta | None = crd_field("Labels and annotations merged into the pods.")
    spec: PodSpecPatch | None = crd_field("Pod spec patch.")


class JobSpecPatch(KubeModel):
    """Patch of a Job spec: only its Pod template."""

    template: PodTemplatePatch | None = crd_field("Pod template patch.")


class JobTemplatePatch(KubeModel):
    """Patch of a replicated job's Job template."""

    metadata: ObjectMeta | None = crd_field("Labels and annotations merged into the Job template.")
    spec: JobSpecPatch | None = crd_field("Job spec patch.")


class ReplicatedJobPatch(KubeModel):
    """Patch of one replicated job, by name."""

    name: str = crd_field("Name of the replicated job.", required=True, minLength=1, maxLength=253)
    template: JobTemplatePatch | None = crd_field("Job template patch.")


class JobSetSpecPatch(KubeModel):
    """Patch of the JobSet spec: per replicated job."""

    replicated_jobs: list[ReplicatedJobPatch] | None = crd_field(
        "Per replicated job patches.", maxItems=100, **_MAP_BY_NAME)


class JobSetTemplatePatch(KubeModel):
    """Patch of the runtime's JobSet template."""

    metadata: ObjectMeta | None = crd_field("Labels and annotations added to the JobSet.")
    spec: JobSetSpecPatch | None = crd_field("JobSet spec patch.")


class TrainingRuntimeSpecPatch(KubeModel):
    """What a runtime patch may change in the runtime."""

    template: JobSetTemplatePatch | None = crd_field("JobSet template patch.")


class RuntimePatch(KubeModel):
    """One owner's patch of the runtime (v2.3.0), e.g. Kueue's."""

    manager: str = crd_field("Who owns this patch (a domain-prefixed path).", required=True,
                             minLength=1, maxLength=253, rules=_IMMUTABLE)
    time: DateTime | None = crd_field("When the patch was last written (informational).")
    training_runtime_spec: TrainingRuntimeSpecPatch | None = crd_field("The patch.")


class TrainJobSpec(KubeModel):
    """Desired state of a TrainJob."""

    runtime_ref: RuntimeRef = crd_field(
        "The runtime this TrainJob is built from.",
        required=True,
        rules=[("self == oldSelf", c.MESSAGE_FIELD_IMMUTABLE)],  # v2.1: runtimeRef is immutable (crds.py)
    )
    initializer: Initializer | None = crd_field("Dataset and model initializers.", rules=_IMMUTABLE)
    trainer: Trainer | None = crd_field(
        "Trainer node settings.",
        rules=[(c.RULE_TRAINER_IMMUTABLE_BUT_NUM_NODES, c.MESSAGE_FIELD_IMMUTABLE)],
    )
    runtime_patches: list[RuntimePatch] | None = crd_field(
        "Patches of the runtime, one per manager, applied in list order after podTemplateOverrides.",
        list_type="map", map_keys=["manager"], maxItems=16,
    )
    active_deadline_seconds: Int64 | None = crd_field(
        "Seconds the TrainJob may be active (counted from creation or the last resume) before it "
        "is failed with reason DeadlineExceeded.", minimum=1, rules=_IMMUTABLE,
    )
    labels: dict[str, str] | None = crd_field("Labels added to the JobSet.")
    annotations: dict[str, str] | None = crd_field("Annotations added to the JobSet.")
    pod_template_overrides: list[PodTemplateOverride] | None = crd_field(
        "Overrides of the runtime's pod templates; later entries win.", list_type="atomic"
    )
    suspend: bool | None = crd_field(
        "Suspend the TrainJob (no pods run while true).", server_default=False
    )
    managed_by: str | None = crd_field(
        "Controller that reconciles this TrainJob.",
        server_default=c.MANAGED_BY_TRAINER,
        maxLength=253,
        rules=[
            (
                f"self in ['{c.MANAGED_BY_TRAINER}', '{c.MANAGED_BY_MULTIKUEUE}']",
                c.MESSAGE_MANAGED_BY_VALUES,
            ),
            ("self == oldSelf", c.MESSAGE_FIELD_IMMUTABLE),  # v2.1: ManagedBy value is immutable (crds.py)
        ],
    )


class JobStatus(JobCounts):
    """Job counters of one replicated job, copied from the JobSet."""

    name: str = crd_field("Name of the replicated job.", required=True, minLength=1, maxLength=253)


class Metric(KubeModel):
    """One training metric reported by the trainer."""

    name: str = crd_field("Metric name.", required=True, minLength=1, maxLength=64)
    value: str = crd_field("Metric value.", required=True, minLength=1, maxLength=64)


class TrainerStatus(KubeModel):
    """Progress of the trainer step (v2.3.0, TrainJobStatus feature gate)."""

    crd_rules: ClassVar[list[tuple[str, str]]] = [
        ("has(self.lastUpdatedTime)", c.MESSAGE_TRAINER_STATUS_LAST_UPDATED),
    ]

    progress_percentage: Int32 | None = crd_field("Progress in percent.", minimum=0, maximum=100)
    estimated_remaining_seconds: Int32 | None = crd_field("Estimated seconds left.", minimum=0)
    metrics: list[Metric] | None = crd_field("Latest metrics.", list_type="atomic", maxItems=256)
    last_updated_time: DateTime | None = crd_field("When this status was reported.")


class ElasticStatus(KubeModel):
    """trainyard: the size of an elastic TrainJob (torch elasticPolicy), read by the scale
    subresource (status replicas and selector) and so by a HorizontalPodAutoscaler."""

    current_nodes: Int32 | None = crd_field(
        "Trainer nodes the JobSet runs with now (its trainer job's parallelism).", minimum=0)
    desired_nodes: Int32 | None = crd_field("Trainer nodes asked for: spec.trainer.numNodes.", minimum=0)
    min_nodes: Int32 | None = crd_field("Lower bound of numNodes (the runtime's elasticPolicy).", minimum=0)
    max_nodes: Int32 | None = crd_field("Upper bound of numNodes (the runtime's elasticPolicy).", minimum=0)
    selector: str | None = crd_field("Label selector of the trainer pods, in the string form.")


class TrainJobStatus(KubeModel):
    """Observed state of a TrainJob."""

    crd_schema: ClassVar[dict] = {"minProperties": 1}

    conditions: list[Condition] | None = crd_field(
        "Conditions: Suspended, Complete, Failed.", list_type="map", map_keys=["type"], maxItems=8
    )
    jobs_status: list[JobStatus] | None = crd_field(
        "Job counters per replicated job.", list_type="map", map_keys=["name"], maxItems=100
    )
    trainer_status: TrainerStatus | None = crd_field("Progress reported by the trainer.")
    state: Literal["Running", "Suspended", "Complete", "Failed"] | None = crd_field(
        "trainyard: what the TrainJob is doing now (never blank; the Status printer column)."
    )
    elastic: ElasticStatus | None = crd_field(
        "trainyard: current and desired size of an elastic TrainJob (the scale subresource's status).")


class TrainJob(KubeObject):
    """A training job: a short spec pointing at a runtime blueprint."""

    API_VERSION: ClassVar[str | None] = c.TRAINER_API_VERSION
    KIND: ClassVar[str | None] = c.TRAIN_JOB_KIND
    crd_rules: ClassVar[list[tuple[str, str]]] = [
        ("self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')", c.MESSAGE_NAME_RFC1035),
        (f"size(self.metadata.name) <= {c.MAX_TRAIN_JOB_NAME_LENGTH}", c.MESSAGE_NAME_TOO_LONG),
    ]

    spec: TrainJobSpec | None = crd_field("Desired state.")
    status: TrainJobStatus | None = crd_field("Observed state.")


class MetricSpec(KubeModel):
    """An autoscaling/v2 metric (schema inlined from Kubernetes)."""

    k8s_definition: ClassVar[str | None] = "io.k8s.api.autoscaling.v2.MetricSpec"

    type: str


class TorchElasticPolicy(KubeModel):
    """Elastic training bounds (declared upstream, not acted on by v2.1.0)."""

    max_restarts: Int32 | None = crd_field("How many times the job may restart.")
    min_nodes: Int32 | None = crd_field("Lower bound on the number of nodes.")
    max_nodes: Int32 | None = crd_field("Upper bound on the number of nodes.")
    metrics: list[MetricSpec] | None = crd_field(
        "Metrics for scaling decisions.", list_type="atomic"
    )


class EnvInjectionTarget(KubeModel):
    """A replicated job and the extra containers that get the PET_* variables."""

    job_name: str = crd_field("Name of the replicated job.", required=True, minLength=1, maxLength=253)
    container_names: list[str] = crd_field(
        "Containers of that job that also get PET_* variables (never node: it always does).",
        required=True, list_type="set", minItems=1, maxItems=8, items_schema={"maxLength": 63},
        rules=[("!self.exists(c, c == 'node')", c.MESSAGE_ENV_INJECTION_NODE)],
    )


class EnvInjection(KubeModel):
    """Which containers besides node receive the framework's environment (v2.3.0)."""

    targets: list[EnvInjectionTarget] | None = crd_field(
        "Target jobs and containers.", list_type="map", map_keys=["jobName"], maxItems=16)


class TorchMLPolicySource(KubeModel):
    """PyTorch (torchrun) settings."""

    num_proc_per_node: IntOrString | None = crd_field(
        "Processes per node: auto, cpu, gpu or a positive integer.",
        server_default=c.TORCH_NUM_PROC_PER_NODE_DEFAULT,
        rules=[("self > 0 || self in ['auto', 'cpu', 'gpu']", c.MESSAGE_NUM_PROC_PER_NODE)],
    )
    elastic_policy: TorchElasticPolicy | None = crd_field("Elastic training settings.")
    env_injection: EnvInjection | None = crd_field("Extra containers that get the PET_* variables.")


class MPIMLPolicySource(KubeModel):
    """MPI (mpirun over SSH) settings."""

    num_proc_per_node: Int32 | None = crd_field(
        "Slots per host in the hostfile.", server_default=c.MPI_NUM_PROC_PER_NODE_DEFAULT
    )
    mpi_implementation: Literal["OpenMPI", ""] | None = crd_field(
        "MPI implementation.", server_default=c.MPI_IMPLEMENTATION_OPENMPI
    )
    ssh_auth_mount_path: str | None = crd_field(
        "Where the SSH keys are mounted in the node container.",
        server_default=c.DEFAULT_SSH_AUTH_MOUNT_PATH,
        maxLength=4096,
    )
    run_launcher_as_node: bool | None = crd_field(
        "Whether the launcher also runs as a training node.", server_default=False
    )


class JAXMLPolicySource(KubeModel):
    """JAX (jax.distributed) settings; none yet (v2.3.0)."""


class XGBoostMLPolicySource(KubeModel):
    """XGBoost (collective/Rabit) settings; none yet: workers per node follow the GPUs (v2.3.0)."""


class FluxMLPolicySource(KubeModel):
    """Flux Framework HPC settings (v2.3.0)."""

    num_proc_per_node: Int32 | None = crd_field(
        "Processes per node.", server_default=1,
        rules=[("self >= 1", c.MESSAGE_FLUX_NUM_PROC_PER_NODE)],
    )


class MLPolicy(KubeModel):
    """The ML framework policy: torch, mpi, jax, xgboost, flux, or none (plain)."""

    # v2.1.0's one-policy rule (torch and mpi) is replaced by v2.3.0's, which covers all five
    # sources with the same message (docs/compatibility.md).
    crd_rules: ClassVar[list[tuple[str, str]]] = [
        (
            "!(has(self.numNodes) && (has(self.torch) && has(self.torch.elasticPolicy)))",
            c.MESSAGE_NUM_NODES_WITH_ELASTIC,
        ),
        (c.RULE_ONE_POLICY_V23, c.MESSAGE_ONE_POLICY),
    ]

    num_nodes: Int32 | None = crd_field("Number of training nodes (1 when unset).")
    torch: TorchMLPolicySource | None = crd_field("PyTorch policy.")
    mpi: MPIMLPolicySource | None = crd_field("MPI policy.")
    flux: FluxMLPolicySource | None = crd_field("Flux Framework policy.")
    jax: JAXMLPolicySource | None = crd_field("JAX policy.")
    xgboost: XGBoostMLPolicySource | None = crd_field("XGBoost policy.")


class CoschedulingPodGroupPolicySource(KubeModel):
    """Gang scheduling with the scheduler-plugins coscheduling plugin."""

    schedule_timeout_seconds: Int32 | None = crd_field(
        "Seconds to wait for the whole gang to be scheduled.",
        server_default=c.DEFAULT_SCHEDULE_TIMEOUT_SECONDS,
    )


class VolcanoNetworkTopology(KubeModel):
    """Network topology constraints for Volcano."""

    mode: Literal["hard", "soft"] | None = crd_field(
        "hard: must be met; soft: best effort.", server_default="hard"
    )
    highest_tier_allowed: int | None = crd_field(
        "Highest network tier the gang may span.", server_default=1
    )


class VolcanoPodGroupPolicySource(KubeModel):
    """Gang scheduling with Volcano."""

    network_topology: VolcanoNetworkTopology | None = crd_field("Network topology constraints.")


class PodGroupPolicy(KubeModel):
    """Gang scheduling policy: coscheduling or volcano."""

    coscheduling: CoschedulingPodGroupPolicySource | None = crd_field("Coscheduling plugin.")
    volcano: VolcanoPodGroupPolicySource | None = crd_field("Volcano scheduler.")


class JobSetTemplateSpec(KubeModel):
    """The JobSet a runtime produces: metadata and spec."""

    crd_schema: ClassVar[dict] = {"minProperties": 1}

    metadata: ObjectMeta | None = crd_field("Labels and annotations of the JobSet.")
    spec: JobSetSpec | None = crd_field("Spec of the JobSet.")


class TrainingRuntimeSpec(KubeModel):
    """A runtime blueprint (shared by TrainingRuntime and ClusterTrainingRuntime)."""

    crd_schema: ClassVar[dict] = {"minProperties": 1}

    ml_policy: MLPolicy | None = crd_field("ML framework policy.")
    pod_group_policy: PodGroupPolicy | None = crd_field("Gang scheduling policy.")
    template: JobSetTemplateSpec | None = crd_field("Template of the JobSet.")


class RuntimeObject(KubeObject):
    """Common shape of both runtime kinds."""

    API_VERSION: ClassVar[str | None] = c.TRAINER_API_VERSION

    spec: TrainingRuntimeSpec | None = crd_field("The runtime blueprint.")


class TrainingRuntime(RuntimeObject):
    """A namespaced runtime blueprint, usable by TrainJobs of its namespace."""

    KIND: ClassVar[str | None] = c.TRAINING_RUNTIME_KIND


class ClusterTrainingRuntime(RuntimeObject):
    """A cluster-wide runtime blueprint, usable by TrainJobs of any namespace."""

    KIND: ClassVar[str | None] = c.CLUSTER_TRAINING_RUNTIME_KIND
    NAMESPACED: ClassVar[bool] = False
