"""Constants of upstream Kubeflow Trainer v2.1.0 (spec §7), spelled exactly as upstream.

Grouped as the spec groups them: labels/annotations/finalizers, names, environment variables,
numbers, TorchTune strings, kinds/groups/managers, conditions and messages.
"""
from __future__ import annotations

# The root-level workspace directory of the training containers (spec: "{WS}").
WORKSPACE_DIR = "/" + "workspace"

# --- 7.1 Labels, annotations, finalizers --------------------------------------------------
LABEL_TRAINJOB_ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"
LABEL_SUPPORT = "trainer.kubeflow.org/support"
SUPPORT_DEPRECATED = "deprecated"
LABEL_FRAMEWORK = "trainer.kubeflow.org/framework"
FINALIZER_RESOURCE_IN_USE = "trainer.kubeflow.org/resource-in-use"
LABEL_COSCHEDULING_POD_GROUP = "scheduling.x-k8s.io/pod-group"
ANNOTATION_VOLCANO_GROUP_NAME = "scheduling.k8s.io/group-name"
ANNOTATION_VOLCANO_QUEUE_NAME = "scheduling.volcano.sh/queue-name"
ANNOTATION_JOB_COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
LABEL_JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"

# Values of the ancestor label.
ANCESTOR_DATASET_INITIALIZER = "dataset-initializer"
ANCESTOR_MODEL_INITIALIZER = "model-initializer"
ANCESTOR_TRAINER = "trainer"

# --- 7.2 Names and name patterns ----------------------------------------------------------
NODE = "node"  # trainer job and container name
LAUNCHER = "launcher"  # MPI launcher job name
DATASET_INITIALIZER = "dataset-initializer"  # job and container name
MODEL_INITIALIZER = "model-initializer"  # job and container name
MPI_SSH_AUTH_SECRET_SUFFIX = "-mpi-ssh-auth"
MPI_HOSTFILE_CONFIGMAP_SUFFIX = "-mpi-hostfile"
MPI_SSH_AUTH_VOLUME_NAME = "mpi-ssh-auth"
MPI_HOSTFILE_VOLUME_NAME = "mpi-hostfile"
MPI_SSH_PRIVATE_KEY = "ssh-privatekey"
MPI_SSH_PUBLIC_KEY = "ssh-publickey"
MPI_SSH_SECRET_TYPE = "kubernetes.io/ssh-auth"
MPI_SSH_PRIVATE_KEY_FILE = "id_rsa"
MPI_SSH_PUBLIC_KEY_FILE = "id_rsa.pub"
MPI_SSH_AUTHORIZED_KEYS_FILE = "authorized_keys"
MPI_HOSTFILE_DIR = "/etc/mpi"
MPI_HOSTFILE_NAME = "hostfile"
MPI_HOSTFILE_PATH = "/etc/mpi/hostfile"
MPI_HOSTFILE_MODE = 0o444
DEFAULT_SSH_AUTH_MOUNT_PATH = "/root/.ssh"
# Declared upstream but unused by the v2.1.0 controller.
DATASET_MOUNT_PATH = WORKSPACE_DIR + "/dataset"
MODEL_MOUNT_PATH = WORKSPACE_DIR + "/model"
INITIALIZER_VOLUME_NAME = "initializer"


def jobset_name(trainjob_name: str) -> str:
    return trainjob_name


def pod_endpoint(trainjob_name: str, replicated_job: str, pod_index: int, subdomain: str) -> str:
    """``<trainJob>-<replicatedJob>-0-<podIndex>.<subdomain>``."""
    return f"{trainjob_name}-{replicated_job}-0-{pod_index}.{subdomain}"


# --- 7.3 Environment variables ------------------------------------------------------------
ENV_PET_NNODES = "PET_NNODES"
ENV_PET_NPROC_PER_NODE = "PET_NPROC_PER_NODE"
ENV_PET_NODE_RANK = "PET_NODE_RANK"
ENV_PET_MASTER_ADDR = "PET_MASTER_ADDR"
ENV_PET_MASTER_PORT = "PET_MASTER_PORT"
ENV_STORAGE_URI = "STORAGE_URI"
ENV_OMPI_HOSTFILE = "OMPI_MCA_orte_default_hostfile"
ENV_OMPI_KEEP_FQDN_HOSTNAMES = "OMPI_MCA_orte_keep_fqdn_hostnames"
ENV_OMPI_SET_DEFAULT_SLOTS = "OMPI_MCA_orte_set_default_slots"
ENV_OMPI_PLM_RSH_ARGS = "OMPI_MCA_plm_rsh_args"
# v2.3.0: OpenMPI variables a TrainJob may not set, and the SSH Secret volume's file modes.
MPI_RESERVED_ENVS = frozenset({ENV_OMPI_HOSTFILE, ENV_OMPI_PLM_RSH_ARGS, ENV_OMPI_KEEP_FQDN_HOSTNAMES,
                               ENV_OMPI_SET_DEFAULT_SLOTS})
MPI_SSH_AUTH_DEFAULT_MODE = 0o400
MPI_SSH_PRIVATE_KEY_FILE_MODE = 0o640
MPI_SSH_PUBLIC_KEY_FILE_MODE = 0o644
OMPI_PLM_RSH_ARGS_VALUE = "-o ConnectionAttempts=10"
TORCH_RESERVED_ENV_NAMES = (
    ENV_PET_NNODES,
    ENV_PET_NPROC_PER_NODE,
    ENV_PET_NODE_RANK,
    ENV_PET_MASTER_ADDR,
    ENV_PET_MASTER_PORT,
)
# fieldRef path of PET_NODE_RANK.
JOB_COMPLETION_INDEX_FIELD_PATH = f"metadata.annotations['{ANNOTATION_JOB_COMPLETION_INDEX}']"

# --- 7.4 Numbers --------------------------------------------------------------------------
CONTAINER_TRAINER_PORT = 29500  # trainer container port, master port, rendezvous port
# v2.3.0 JAX (jax.distributed.initialize) and XGBoost (collective / Rabit tracker) variables.
ENV_JAX_NUM_PROCESSES = "JAX_NUM_PROCESSES"
ENV_JAX_PROCESS_ID = "JAX_PROCESS_ID"
ENV_JAX_COORDINATOR_ADDRESS = "JAX_COORDINATOR_ADDRESS"
ENV_XGBOOST_TRACKER_URI = "DMLC_TRACKER_URI"
ENV_XGBOOST_TRACKER_PORT = "DMLC_TRACKER_PORT"
ENV_XGBOOST_TASK_ID = "DMLC_TASK_ID"
ENV_XGBOOST_NUM_WORKER = "DMLC_NUM_WORKER"
XGBOOST_RESERVED_ENVS = frozenset({ENV_XGBOOST_TRACKER_URI, ENV_XGBOOST_TRACKER_PORT, ENV_XGBOOST_TASK_ID,
                                   ENV_XGBOOST_NUM_WORKER})
ANCESTOR_JOB_REPLICAS = 1
DEFAULT_SCHEDULE_TIMEOUT_SECONDS = 60
MPI_NUM_PROC_PER_NODE_DEFAULT = 1
DEFAULT_NUM_NODES = 1
EVENT_MESSAGE_MAX_CHARS = 950
EVENT_MESSAGE_TRUNCATION_SUFFIX = " ..."
RUNTIME_ENQUEUE_DELAY_SECONDS = 1
RUNTIME_NOTIFICATION_BUFFER = 10
MAX_TRAIN_JOB_NAME_LENGTH = 63
TORCH_NUM_PROC_PER_NODE_DEFAULT = "auto"
TORCH_NUM_PROC_PER_NODE_KEYWORDS = ("auto", "cpu", "gpu")

# --- 7.5 TorchTune strings ----------------------------------------------------------------
TORCHTUNE_ENTRYPOINT = ("tune", "run")
TORCHTUNE_CONFIG_FLAG = "--config"
TORCHTUNE_RDZV_ENDPOINT_FLAG = "--rdzv_endpoint"
TORCHTUNE_RECIPE_FULL_SINGLE_DEVICE = "full_finetune_single_device"
TORCHTUNE_RECIPE_FULL_DISTRIBUTED = "full_finetune_distributed"
TORCHTUNE_RECIPE_LORA_SINGLE_DEVICE = "lora_finetune_single_device"
TORCHTUNE_RECIPE_LORA_DISTRIBUTED = "lora_finetune_distributed"
TORCHTUNE_CONFIG_SUFFIX_FULL_SINGLE_DEVICE = "_full_single_device"
TORCHTUNE_CONFIG_SUFFIX_FULL = "_full"
TORCHTUNE_CONFIG_SUFFIX_FULL_MULTINODE = "_full_multinode"
TORCHTUNE_CONFIG_SUFFIX_LORA_SINGLE_DEVICE = "_lora_single_device"
TORCHTUNE_CONFIG_SUFFIX_QLORA_SINGLE_DEVICE = "_qlora_single_device"
TORCHTUNE_CONFIG_SUFFIX_LORA = "_lora"
TORCHTUNE_CONFIG_SUFFIX_QLORA = "_qlora"
TORCHTUNE_ARG_LORA = "model.lora_attn_modules"
TORCHTUNE_ARG_QLORA = "model.quantize_base"
TORCHTUNE_ARG_DORA = "model.use_dora"
TORCHTUNE_COPIED_CONFIG_KEYS = (
    "output_dir",
    "tokenizer.path",
    "checkpointer.checkpoint_dir",
    "tokenizer.merges_file",
)
TORCHTUNE_SUPPORTED_MODELS = ("llama3_2/1B", "llama3_2/3B", "llama3_3/70B", "qwen2_5/1.5B")

# --- 7.6 Kinds, API groups, managers ------------------------------------------------------
TRAINER_API_GROUP = "trainer.kubeflow.org"
TRAINER_API_VERSION_NAME = "v1alpha1"
TRAINER_API_VERSION = f"{TRAINER_API_GROUP}/{TRAINER_API_VERSION_NAME}"
TRAIN_JOB_KIND = "TrainJob"
TRAINING_RUNTIME_KIND = "TrainingRuntime"
CLUSTER_TRAINING_RUNTIME_KIND = "ClusterTrainingRuntime"
REGISTRY_KEY_TRAINING_RUNTIME = f"{TRAINING_RUNTIME_KIND}.{TRAINER_API_GROUP}"
REGISTRY_KEY_CLUSTER_TRAINING_RUNTIME = f"{CLUSTER_TRAINING_RUNTIME_KIND}.{TRAINER_API_GROUP}"
JOBSET_API_GROUP = "jobset.x-k8s.io"
JOBSET_API_VERSION = "jobset.x-k8s.io/v1alpha2"
JOBSET_KIND = "JobSet"
COSCHEDULING_API_GROUP = "scheduling.x-k8s.io"
COSCHEDULING_API_VERSION = "scheduling.x-k8s.io/v1alpha1"
VOLCANO_API_GROUP = "scheduling.volcano.sh"
VOLCANO_API_VERSION = "scheduling.volcano.sh/v1beta1"
POD_GROUP_KIND = "PodGroup"
VOLCANO_QUEUE_KIND = "Queue"
FIELD_MANAGER = "trainer"
MANAGED_BY_TRAINER = "trainer.kubeflow.org/trainjob-controller"
MANAGED_BY_MULTIKUEUE = "kueue.x-k8s.io/multikueue"
PLUGIN_COSCHEDULING = "CoScheduling"
PLUGIN_VOLCANO = "Volcano"
PLUGIN_MPI = "MPI"
PLUGIN_PLAIN_ML = "PlainML"
PLUGIN_TORCH = "Torch"
PLUGIN_JOBSET = "JobSet"
MPI_IMPLEMENTATION_OPENMPI = "OpenMPI"
MPI_IMPLEMENTATION_INTEL = "Intel"
MPI_IMPLEMENTATION_MPICH = "MPICH"
# Kubernetes' own PriorityClass API (Volcano's PodGroups name a PriorityClass).
PRIORITY_CLASS_API_VERSION = "scheduling.k8s.io/v1"
VOLCANO_SYSTEM_PRIORITY_CLASSES = ("system-cluster-critical", "system-node-critical")
RUNTIME_DEPRECATION_POLICY_URL = (
    "https://www.kubeflow.org/docs/components/trainer/operator-guides/runtime/"
    "#runtime-deprecation-policy"
)
INDEX_TRAINJOB_TRAINING_RUNTIME = ".spec.runtimeRef.kind=trainingRuntime"
INDEX_TRAINJOB_CLUSTER_TRAINING_RUNTIME = ".spec.runtimeRef.kind=clusterTrainingRuntime"
INDEX_TRAINING_RUNTIME_CLASS = (
    ".trainingRuntimeSpec.jobSetTemplateSpec.replicatedJobs.podTemplateSpec.runtimeClassName"
)
INDEX_CLUSTER_TRAINING_RUNTIME_CLASS = (
    ".clusterTrainingRuntimeSpec.jobSetTemplateSpec.replicatedJobs.podTemplateSpec.runtimeClassName"
)

# --- 7.7 Conditions, reasons, messages, events --------------------------------------------
CONDITION_SUSPENDED = "Suspended"
CONDITION_COMPLETE = "Complete"
CONDITION_FAILED = "Failed"
REASON_SUSPENDED = "Suspended"
REASON_RESUMED = "Resumed"
REASON_TRAINING_RUNTIME_NOT_SUPPORTED = "TrainingRuntimeNotSupported"
MESSAGE_SUSPENDED = "TrainJob is suspended"
MESSAGE_RESUMED = "TrainJob is resumed"
# v2.3.0: spec.activeDeadlineSeconds exceeded.
REASON_DEADLINE_EXCEEDED = "DeadlineExceeded"
MESSAGE_DEADLINE_EXCEEDED = "TrainJob exceeded its active deadline"
# trainyard additions (no upstream name exists; docs/compatibility.md).
# Opt-in: a finished TrainJob is deleted (children by garbage collection) this many seconds
# after it finished (kubeflow/trainer#4052).
ANNOTATION_TTL_SECONDS_AFTER_FINISHED = "trainyard.kubeflow.org/ttl-seconds-after-finished"
# status.state: Running, Suspended, Complete or Failed, for the extra `Status` printer column.
STATE_RUNNING = "Running"
STATE_SUSPENDED = "Suspended"
# JobSet condition types, reasons and messages the status plugin copies.
JOBSET_CONDITION_COMPLETED = "Completed"
JOBSET_CONDITION_FAILED = "Failed"
JOBSET_CONDITION_SUSPENDED = "Suspended"
JOBSET_REASON_ALL_JOBS_COMPLETED = "AllJobsCompleted"
JOBSET_MESSAGE_COMPLETED = "jobset completed successfully"
JOBSET_REASON_FAILED_JOBS = "FailedJobs"
JOBSET_REASON_REACHED_MAX_RESTARTS = "ReachedMaxRestarts"
JOBSET_REASON_FAIL_POLICY_ACTION = "FailJobSetFailurePolicyAction"
JOBSET_MESSAGE_FAILED_JOBS = "jobset failed due to one or more job failures"
EVENT_TYPE_WARNING = "Warning"
EVENT_TYPE_NORMAL = "Normal"
EVENT_REASON_RESOURCES_CREATION_FAILED = "TrainJobResourcesCreationFailed"
EVENT_MESSAGE_RESOURCES_CREATION_FAILED = "TrainJob resources reconciliation failed: "


def unsupported_runtime_message(registry_key: str) -> str:
    """``unsupported runtime: <key>`` (the key may be empty)."""
    return f"unsupported runtime: {registry_key}"


# CEL rule messages of the CRDs (verbatim).
MESSAGE_RUNTIME_REF_IMMUTABLE = "runtimeRef is immutable"
MESSAGE_MANAGED_BY_VALUES = (
    "ManagedBy must be trainer.kubeflow.org/trainjob-controller or kueue.x-k8s.io/multikueue if set"
)
MESSAGE_MANAGED_BY_IMMUTABLE = "ManagedBy value is immutable"
MESSAGE_NAME_RFC1035 = "metadata.name must match RFC 1035 DNS label format"
MESSAGE_NAME_TOO_LONG = "metadata.name must be no more than 63 characters"
MESSAGE_NUM_NODES_WITH_ELASTIC = "numNodes should not be set if torch.elasticPolicy is configured"
MESSAGE_ONE_POLICY = "Only one of the policy can be configured"
MESSAGE_NUM_PROC_PER_NODE = "NumProcPerNode must be equal to auto, cpu, gpu, or int value"
MESSAGE_STARTUP_DEPENDS_ON = "StartupPolicy and DependsOn APIs are mutually exclusive"
MESSAGE_VALUE_IMMUTABLE = "Value is immutable"
# v2.3.0 rules.
MESSAGE_FIELD_IMMUTABLE = "field is immutable"
MESSAGE_STORAGE_URI = "storageUri may be empty, or it must be a valid URI (scheme://...)"
RULE_STORAGE_URI = "self == '' || self.matches('^[A-Za-z][A-Za-z0-9+.-]*://.+$')"
MESSAGE_TRAINER_STATUS_LAST_UPDATED = "lastUpdatedTime is required when trainerStatus is present"
RULE_ONE_POLICY_V23 = "[has(self.torch), has(self.mpi), has(self.jax), has(self.xgboost),has(self.flux)].filter(x, x).size() <= 1"
MESSAGE_FLUX_NUM_PROC_PER_NODE = "NumProcPerNode in fluxPolicy must be >= 1"
MESSAGE_ENV_INJECTION_NODE = ("containerNames must not include the main node container because PET_* envs "
                              "are always injected into it")
# v2.3.0's `spec.trainer` is immutable as a whole; trainyard's rule (same path and message)
# leaves numNodes out, which the webhook guards instead (elastic runtimes may change it).
TRAINER_IMMUTABLE_FIELDS = ("image", "command", "args", "env", "resourcesPerNode", "numProcPerNode")
RULE_TRAINER_IMMUTABLE_BUT_NUM_NODES = " && ".join(
    f"(has(self.{f}) ? (has(oldSelf.{f}) && self.{f} == oldSelf.{f}) : !has(oldSelf.{f}))"
    for f in TRAINER_IMMUTABLE_FIELDS)

# --- 7.8 Error and warning texts (webhooks, planning) -------------------------------------
ERR_TRAINING_RUNTIME_MUST_EXIST = (
    "specified trainingRuntime must be created before the TrainJob is created"
)
ERR_CLUSTER_TRAINING_RUNTIME_MUST_EXIST = (
    "specified clusterTrainingRuntime must be created before the TrainJob is created"
)
ERR_TRAINING_RUNTIME_NOT_FOUND = "TrainingRuntime specified in TrainJob is not found: "
ERR_CLUSTER_TRAINING_RUNTIME_NOT_FOUND = "not found ClusterTrainingRuntime specified in TrainJob: "
ERR_ALWAYS_ONE = "always must be 1"
ERR_MISSING_ANCESTOR_CONTAINER = "must contain the required container for the ancestor: "
ERR_TORCH_NUM_PROC_PER_NODE = "must have an int value or [auto cpu gpu]"
ERR_TORCH_RESERVED_ENVS = "must not have reserved envs, invalid envs configured: "
ERR_TORCHTUNE_UNSUPPORTED_MODEL = "must have a supported pretrained model, invalid model configured: "
ERR_MPI_NUM_PROC_PER_NODE = "must have an int value for MPI TrainJob"
ERR_MPI_RUN_LAUNCHER_AS_NODE = (
    "must have 1 when MPI trainingRuntime with enabled runLauncherAsNode does not have either"
    " launcher and node"
)
ERR_DATASET_INITIALIZER_JOB = (
    "must have dataset-initializer job when trainJob is configured with input datasetConfig"
)
ERR_DATASET_INITIALIZER_CONTAINER = (
    "must have container with name - dataset-initializer in the dataset-initializer job"
)
ERR_MODEL_INITIALIZER_JOB = (
    "must have model-initializer job when trainJob is configured with input modelConfig"
)
ERR_MODEL_INITIALIZER_CONTAINER = (
    "must have container with name - model-initializer in the model-initializer job"
)
ERR_TARGET_JOB_NOT_FOUND = "must not have targetJob that doesn't exist in the runtime job template"
ERR_OVERRIDE_ENVS = "must not have envs for the dataset-initializer, model-initializer, node containers"
ERR_OVERRIDES_NOT_SUSPENDED = "PodTemplateOverrides can only be modified when the TrainJob is suspended"
ERR_VOLCANO_EMPTY_QUEUE = "Volcano queue name must not be empty"
ERR_RUNTIME_INFO_MISSING = "runtime info or object is missing"
ERR_TOO_MANY_STATUS_PLUGINS = "too many TrainJobStatus plugins are registered"
ERR_JOBSET_CRDS_MISSING = "JobSet CRDs must be installed in advance"
ERR_PODGROUP_CRDS_MISSING = "PodGroup CRDs must be installed in advance"


def deprecated_runtime_warning(name: str, *, referenced: bool) -> str:
    """The deprecation warning of the TrainJob webhook (``referenced``) or the runtime webhook."""
    prefix = "Referenced " if referenced else ""
    return (
        f'{prefix}ClusterTrainingRuntime "{name}" is deprecated and will be removed in a future'
        f" release of Kubeflow Trainer. See runtime deprecation policy:"
        f" {RUNTIME_DEPRECATION_POLICY_URL}"
    )


# Messages with a placeholder: fill with ``.format(...)``.
ERR_MISSING_INIT_CONTAINER = "must not have initContainer that doesn't exist in the runtime job {job}"
ERR_MISSING_CONTAINER = "must not have container that doesn't exist in the runtime job {job}"
ERR_OVERRIDES_JOB_ACTIVE = (
    "PodTemplateOverrides cannot be modified when the JobSet's ReplicatedJob {job} is still active"
)
# v2.3.0 runtimePatches (JobSet plugin).
ERR_PATCHES_NOT_SUSPENDED = ("RuntimePatches can only be modified when the TrainJob is suspended before or "
                             "after the update")
ERR_PATCHES_JOB_ACTIVE = "RuntimePatches cannot be modified when the JobSet's ReplicatedJob {job} is still active"
ERR_PATCH_JOB_NOT_FOUND = "must not have replicated job that doesn't exist in the runtime job template"
ERR_DOMAIN_PREFIXED_PATH = 'must be a domain-prefixed path (such as "acme.io/foo")'
ERR_TORCHTUNE_SINGLE_NODE = "must be 1 for {model} model"
ERR_TORCHTUNE_QLORA_UNSUPPORTED = "QLoRA is not supported for {model} model"
ERR_TORCHTUNE_QLORA_NUM_PROC = "must be auto or 1 for {model} model when using QLoRA"
ERR_TORCHTUNE_QLORA_GPU = "must have gpu resource with value 1 for {model} model when using QLoRA"
ERR_MPI_IMPLEMENTATION_UNSUPPORTED = "MPI implementation for {value} doesn't supported"
ERR_VOLCANO_PRIORITY_CLASS_MISSING = 'PriorityClass "{name}" doesn\'t exist: {error}'
ERR_SSH_AUTH_SECRET_BUILD = "failed to build SSH Auth secret: {error}"

# v2.3.0 Flux (pkg/constants): the installer image and broker defaults a TrainJob's or the
# runtime's trainer env may change (FLUX_VIEW_IMAGE, FLUX_NETWORK_DEVICE, FLUX_QUEUE_POLICY),
# and the names and paths of what the plugin adds to the node pods.
FLUX_INSTALLER_IMAGE = "ghcr.io/converged-computing/flux-view-ubuntu:tag-jammy"
FLUX_NETWORK_DEVICE = "eth0"
FLUX_QUEUE_POLICY = "fcfs"
FLUX_INSTALLER_CONTAINER_NAME = "flux-installer"
FLUX_INSTALL_VOLUME_NAME = "flux-install"
FLUX_VOLUME_PATH = "/mnt/flux"
FLUX_CONFIG_MOUNT_PATH = "/etc/flux-config"  # upstream's FluxConfigVolumeName, used as a mount path
FLUX_CURVE_VOLUME_NAME = "flux-curve"
FLUX_CURVE_VOLUME_PATH = "/curve"
FLUX_MEMORY_VOLUME_NAME = "shared-memory"
FLUX_MEMORY_VOLUME_PATH = "/dev/shm"
FLUX_SPACK_VIEW_VOLUME_NAME = "spack-install"
FLUX_SPACK_VIEW_VOLUME_PATH = "/opt/software"
FLUX_ENTRYPOINT_CONFIGMAP_SUFFIX = "-flux-entrypoint"
FLUX_CURVE_SECRET_SUFFIX = "-flux-curve"
FLUX_CURVE_CERT_KEY = "curve.cert"
FLUX_CONFIGMAP_DEFAULT_MODE = 0o755
FLUX_CURVE_DEFAULT_MODE = 0o400
