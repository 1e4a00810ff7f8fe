"""jobset.x-k8s.io/v1alpha2 JobSet.

One ``JobSetSpec`` serves both the JobSet kind and the ``spec.template.spec`` of trainer
runtimes (upstream embeds the same Go type), so its defaults and CEL rules are declared once.
"""
from __future__ import annotations

from typing import ClassVar, Literal

from trainyard.api.batch import JobTemplateSpec
from trainyard.api.meta import Condition, Int32, KubeModel, KubeObject, crd_field

IMMUTABLE = [("self == oldSelf", "Value is immutable")]


class DependsOn(KubeModel):
    """A replicated job that must reach a status before this one starts."""

    name: str = crd_field("Name of the replicated job this one waits for.", required=True)
    status: Literal["Ready", "Complete"] = crd_field(
        "Status the awaited replicated job must reach: Ready or Complete.", required=True
    )


class ReplicatedJob(KubeModel):
    """A group of identical Jobs created from one template."""

    name: str = crd_field("Name of the replicated job; unique in the JobSet.", required=True)
    group_name: str | None = crd_field(
        "Name of the group this replicated job belongs to.", server_default="default"
    )
    template: JobTemplateSpec = crd_field("Template of the Jobs to create.", required=True)
    replicas: Int32 | None = crd_field(
        "Number of Jobs created from the template.", server_default=1, minimum=0
    )
    depends_on: list[DependsOn] | None = crd_field(
        "Replicated jobs that must reach a status before this one is created.",
        list_type="map",
        map_keys=["name"],
        maxItems=5,
        rules=IMMUTABLE,
    )


class Network(KubeModel):
    """Pod networking of the JobSet (headless service, hostnames)."""

    enable_dns_hostnames: bool | None = crd_field(
        "Give pods stable DNS hostnames through a headless service.", alias="enableDNSHostnames"
    )
    subdomain: str | None = crd_field("Subdomain (headless service name); the JobSet name when unset.")
    publish_not_ready_addresses: bool | None = crd_field(
        "Publish pod addresses before the pods are ready."
    )


class SuccessPolicy(KubeModel):
    """When the JobSet counts as completed."""

    operator: Literal["All", "Any"] = crd_field(
        "All: every targeted Job must succeed; Any: one is enough.", required=True
    )
    target_replicated_jobs: list[str] | None = crd_field(
        "Replicated jobs the operator applies to; all when empty.", list_type="atomic"
    )


class FailurePolicyRule(KubeModel):
    """An action to take when a matching Job fails."""

    name: str = crd_field("Name of the rule.", required=True)
    action: Literal[
        "FailJobSet",
        "RestartJobSet",
        "RestartJobSetAndIgnoreMaxRestarts",
        "RestartJob",
        "RestartJobAndIgnoreMaxRestarts",
    ] = crd_field("What to do when the rule matches.", required=True)
    on_job_failure_reasons: list[str] | None = crd_field("Job failure reasons the rule matches.")
    on_job_failure_message_patterns: list[str] | None = crd_field(
        "Regular expressions over the Job failure message the rule matches."
    )
    target_replicated_jobs: list[str] | None = crd_field(
        "Replicated jobs the rule applies to; all when empty.", list_type="atomic"
    )


class FailurePolicy(KubeModel):
    """How failed Jobs are handled (restarts, rules)."""

    max_restarts: Int32 | None = crd_field("How many times the JobSet may be restarted.")
    restart_strategy: Literal["Recreate", "BlockingRecreate", "InPlaceRestart"] | None = crd_field(
        "How Jobs are recreated on a restart.", server_default="Recreate"
    )
    rules: list[FailurePolicyRule] | None = crd_field("Rules evaluated in order on a Job failure.")


class StartupPolicy(KubeModel):
    """In which order replicated jobs are started."""

    startup_policy_order: Literal["AnyOrder", "InOrder"] = crd_field(
        "AnyOrder starts everything at once; InOrder waits for each replicated job to be ready.",
        required=True,
    )


class Coordinator(KubeModel):
    """The pod whose stable endpoint is published as the coordinator."""

    replicated_job: str = crd_field("Replicated job of the coordinator pod.", required=True)
    job_index: int | None = crd_field("Job index of the coordinator pod.")
    pod_index: int | None = crd_field("Pod index of the coordinator pod.")


class PersistentVolumeClaimTemplate(KubeModel):
    """A PersistentVolumeClaim template (schema inlined from Kubernetes)."""

    k8s_definition: ClassVar[str | None] = "io.k8s.api.core.v1.PersistentVolumeClaim"


class VolumeRetentionPolicy(KubeModel):
    """What happens to the claims when the JobSet is deleted."""

    when_deleted: Literal["Delete", "Retain"] | None = crd_field(
        "Delete or Retain the claims on JobSet deletion.", server_default="Delete"
    )


class VolumeClaimPolicy(KubeModel):
    """PersistentVolumeClaims created for the JobSet and mounted into its pods."""

    crd_rules: ClassVar[list[tuple[str, str]]] = [
        (
            "self.templates.all(t, !has(t.metadata.namespace) || size(t.metadata.namespace) == 0)",
            "namespace cannot be set for VolumeClaimPolicies templates",
        )
    ]

    templates: list[PersistentVolumeClaimTemplate] | None = crd_field(
        "Claim templates.", list_type="atomic", maxItems=50
    )
    retention_policy: VolumeRetentionPolicy | None = crd_field("Retention of the claims.")


class JobSetSpec(KubeModel):
    """Desired state of a JobSet."""

    crd_rules: ClassVar[list[tuple[str, str]]] = [
        (
            "!(has(self.startupPolicy) && self.startupPolicy.startupPolicyOrder == 'InOrder'"
            " && self.replicatedJobs.exists(x, has(x.dependsOn)))",
            "StartupPolicy and DependsOn APIs are mutually exclusive",
        )
    ]

    replicated_jobs: list[ReplicatedJob] | None = crd_field(
        "The groups of Jobs of this JobSet.", list_type="map", map_keys=["name"]
    )
    network: Network | None = crd_field("Pod networking.", rules=IMMUTABLE)
    success_policy: SuccessPolicy | None = crd_field("When the JobSet succeeds.", rules=IMMUTABLE)
    failure_policy: FailurePolicy | None = crd_field("How failures are handled.", rules=IMMUTABLE)
    startup_policy: StartupPolicy | None = crd_field("Start-up order.", rules=IMMUTABLE)
    suspend: bool | None = crd_field("Suspend the JobSet: no pods run while true.")
    coordinator: Coordinator | None = crd_field("The coordinator pod, published as a label.")
    managed_by: str | None = crd_field("The controller that manages this JobSet.")
    ttl_seconds_after_finished: Int32 | None = crd_field(
        "Seconds after which a finished JobSet is deleted.", minimum=0
    )
    volume_claim_policies: list[VolumeClaimPolicy] | None = crd_field(
        "Claims created for the JobSet.",
        list_type="atomic",
        maxItems=50,
        rules=IMMUTABLE,
    )


class JobCounts(KubeModel):
    """Pod-level Job counters of one replicated job."""

    name: str = crd_field("Name of the replicated job.", required=True, minLength=1)
    ready: Int32 = crd_field("Jobs with ready pods.", required=True, minimum=0)
    succeeded: Int32 = crd_field("Jobs that succeeded.", required=True, minimum=0)
    failed: Int32 = crd_field("Jobs that failed.", required=True, minimum=0)
    active: Int32 = crd_field("Jobs with active pods.", required=True, minimum=0)
    suspended: Int32 = crd_field("Jobs that are suspended.", required=True, minimum=0)


class ReplicatedJobStatus(JobCounts):
    """Counters of one replicated job of a JobSet."""

    job_restarts: list[Int32] | None = crd_field(
        "Restart count of each Job.", list_type="atomic", maxItems=1024
    )
    job_restarts_count_towards_max: list[Int32] | None = crd_field(
        "Restarts of each Job that count towards maxRestarts.", list_type="atomic", maxItems=1024
    )


class JobSetStatus(KubeModel):
    """Observed state of a JobSet."""

    conditions: list[Condition] | None = crd_field(
        "Conditions (Completed, Failed, Suspended, StartupPolicyCompleted).",
        list_type="map",
        map_keys=["type"],
    )
    restarts: Int32 | None = crd_field("How many times the JobSet was restarted.")
    restarts_count_towards_max: Int32 | None = crd_field("Restarts counted towards maxRestarts.")
    terminal_state: str | None = crd_field("Completed or Failed once the JobSet finished.")
    replicated_jobs_status: list[ReplicatedJobStatus] | None = crd_field(
        "Counters per replicated job.", list_type="map", map_keys=["name"]
    )
    current_in_place_restart_attempt: Int32 | None = crd_field(
        "Current in-place restart attempt.", minimum=0
    )
    previous_in_place_restart_attempt: Int32 | None = crd_field(
        "Previous in-place restart attempt.", minimum=0
    )


class JobSet(KubeObject):
    """A set of Jobs run together as one workload."""

    API_VERSION: ClassVar[str | None] = "jobset.x-k8s.io/v1alpha2"
    KIND: ClassVar[str | None] = "JobSet"

    spec: JobSetSpec | None = crd_field("Desired state.")
    status: JobSetStatus | None = crd_field("Observed state.")
