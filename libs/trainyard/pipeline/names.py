"""The spec §7 constants the pipeline reads.

Single source: ``trainyard.api.constants`` (the models package) when it provides a name;
this module only re-exports them under the names the plugins use, so no plugin spells a
label key, env var name or message itself.
"""
from __future__ import annotations

# NOTE: kept as literals until trainyard.api.constants lands; see _adopt_api_constants below.
API_GROUP = "trainer.kubeflow.org"
API_VERSION = "trainer.kubeflow.org/v1alpha1"
TRAINJOB_KIND = "TrainJob"
TRAINING_RUNTIME_KIND = "TrainingRuntime"
CLUSTER_TRAINING_RUNTIME_KIND = "ClusterTrainingRuntime"
JOBSET_API_VERSION = "jobset.x-k8s.io/v1alpha2"
JOBSET_KIND = "JobSet"
COSCHEDULING_API_VERSION = "scheduling.x-k8s.io/v1alpha1"
VOLCANO_API_VERSION = "scheduling.volcano.sh/v1beta1"
POD_GROUP_KIND = "PodGroup"
PRIORITY_CLASS_API_VERSION = "scheduling.k8s.io/v1"

LABEL_ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"
LABEL_SUPPORT = "trainer.kubeflow.org/support"
SUPPORT_DEPRECATED = "deprecated"
LABEL_POD_GROUP = "scheduling.x-k8s.io/pod-group"
ANNOTATION_VOLCANO_GROUP_NAME = "scheduling.k8s.io/group-name"
ANNOTATION_VOLCANO_QUEUE = "scheduling.volcano.sh/queue-name"
JOB_COMPLETION_INDEX_FIELD_PATH = "metadata.annotations['batch.kubernetes.io/job-completion-index']"

ANCESTOR_TRAINER = "trainer"
ANCESTOR_DATASET = "dataset-initializer"
ANCESTOR_MODEL = "model-initializer"
NODE = "node"
LAUNCHER = "launcher"
DATASET_INITIALIZER = "dataset-initializer"
MODEL_INITIALIZER = "model-initializer"

MANAGED_BY_DEFAULT = "trainer.kubeflow.org/trainjob-controller"
MANAGED_BY_MULTIKUEUE = "kueue.x-k8s.io/multikueue"

ENV_NNODES = "PET_NNODES"
ENV_NPROC_PER_NODE = "PET_NPROC_PER_NODE"
ENV_NODE_RANK = "PET_NODE_RANK"
ENV_MASTER_ADDR = "PET_MASTER_ADDR"
ENV_MASTER_PORT = "PET_MASTER_PORT"
TORCH_RESERVED_ENVS = (ENV_NNODES, ENV_NPROC_PER_NODE, ENV_NODE_RANK, ENV_MASTER_ADDR, ENV_MASTER_PORT)
ENV_STORAGE_URI = "STORAGE_URI"
ENV_OMPI_HOSTFILE = "OMPI_MCA_orte_default_hostfile"
ENV_OMPI_KEEP_FQDN = "OMPI_MCA_orte_keep_fqdn_hostnames"
ENV_OMPI_SLOTS = "OMPI_MCA_orte_set_default_slots"
ENV_OMPI_RSH_ARGS = "OMPI_MCA_plm_rsh_args"

CONTAINER_TRAINER_PORT = 29500
DEFAULT_SCHEDULE_TIMEOUT_SECONDS = 60

MPI_SSH_AUTH_SUFFIX = "-mpi-ssh-auth"
MPI_HOSTFILE_SUFFIX = "-mpi-hostfile"
MPI_SSH_AUTH_VOLUME = "mpi-ssh-auth"
MPI_HOSTFILE_VOLUME = "mpi-hostfile"
MPI_HOSTFILE_DIR = "/etc/mpi"
MPI_HOSTFILE_KEY = "hostfile"
MPI_HOSTFILE_PATH = "/etc/mpi/hostfile"
MPI_HOSTFILE_MODE = 0o444
MPI_SSH_PRIVATE_KEY = "ssh-privatekey"
MPI_SSH_PUBLIC_KEY = "ssh-publickey"
MPI_SECRET_TYPE = "kubernetes.io/ssh-auth"
MPI_DEFAULT_SSH_MOUNT_PATH = "/root/.ssh"
MPI_OPENMPI = "OpenMPI"

TORCHTUNE_ENTRYPOINT = ["tune", "run"]
TORCHTUNE_SUPPORTED_MODELS = ("llama3_2/1B", "llama3_2/3B", "llama3_3/70B", "qwen2_5/1.5B")
TORCHTUNE_KEPT_CONFIG_KEYS = ("output_dir", "tokenizer.path", "checkpointer.checkpoint_dir", "tokenizer.merges_file")

DEPRECATION_POLICY_URL = (
    "https://www.kubeflow.org/docs/components/trainer/operator-guides/runtime/#runtime-deprecation-policy"
)

CONDITION_SUSPENDED = "Suspended"
CONDITION_COMPLETE = "Complete"
CONDITION_FAILED = "Failed"
REASON_SUSPENDED = "Suspended"
REASON_RESUMED = "Resumed"
REASON_RUNTIME_NOT_SUPPORTED = "TrainingRuntimeNotSupported"
MESSAGE_SUSPENDED = "TrainJob is suspended"
MESSAGE_RESUMED = "TrainJob is resumed"
JOBSET_CONDITION_COMPLETED = "Completed"
JOBSET_CONDITION_FAILED = "Failed"
