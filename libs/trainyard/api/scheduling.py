"""Gang-scheduling PodGroups: scheduler-plugins (coscheduling) and Volcano."""
from __future__ import annotations

from typing import ClassVar, Literal

from trainyard.api import constants as c
from trainyard.api.meta import DateTime, Int32, KubeModel, KubeObject, Quantity, crd_field
from trainyard.apimachinery.dns_names import DNS1123_SUBDOMAIN



class PodGroupCounts(KubeModel):
    """Pod counters shared by both PodGroup statuses."""

    running: Int32 | None = crd_field("Pods running.", minimum=0)
    succeeded: Int32 | None = crd_field("Pods that succeeded.", minimum=0)
    failed: Int32 | None = crd_field("Pods that failed.", minimum=0)


class CoschedulingPodGroupSpec(KubeModel):
    """Gang constraints for the coscheduling plugin."""

    min_member: Int32 | None = crd_field("Pods that must be schedulable together.", minimum=1)
    min_resources: dict[str, Quantity] | None = crd_field("Resources the whole gang needs.")
    schedule_timeout_seconds: Int32 | None = crd_field("Seconds to wait for the gang.")


class CoschedulingPodGroupStatus(PodGroupCounts):
    phase: str | None = crd_field("Phase of the PodGroup.")
    occupied_by: str | None = crd_field("Object that owns the PodGroup.")
    schedule_start_time: DateTime | None = crd_field("When scheduling of the gang started.")


class CoschedulingPodGroup(KubeObject):
    """scheduling.x-k8s.io/v1alpha1 PodGroup."""

    API_VERSION: ClassVar[str | None] = c.COSCHEDULING_API_VERSION
    KIND: ClassVar[str | None] = c.POD_GROUP_KIND

    spec: CoschedulingPodGroupSpec | None = crd_field("Gang constraints.")
    status: CoschedulingPodGroupStatus | None = crd_field("Observed state.")


class VolcanoNetworkTopologySpec(KubeModel):
    """Network topology constraint of a Volcano PodGroup."""

    mode: Literal["hard", "soft"] | None = crd_field(
        "hard: must be met; soft: best effort.", server_default="hard"
    )
    highest_tier_allowed: int | None = crd_field("Highest tier the gang may span.", minimum=0)
    highest_tier_name: str | None = crd_field("Name of the highest tier.", maxLength=253)


class LabelSelector(KubeModel):
    """A label selector (schema inlined from Kubernetes)."""

    k8s_definition: ClassVar[str | None] = "io.k8s.apimachinery.pkg.apis.meta.v1.LabelSelector"


class SubGroupPolicy(KubeModel):
    """A sub-gang of pods selected by labels."""

    name: str | None = crd_field("Name of the sub-group policy.", maxLength=253)
    label_selector: LabelSelector | None = crd_field("Pods of the sub-group.", map_type="atomic")
    match_label_keys: list[str] | None = crd_field(
        "Label keys whose values split pods into sub-groups.", list_type="atomic"
    )
    sub_group_size: Int32 | None = crd_field("Pods per sub-group.", server_default=1, minimum=1)
    min_sub_groups: Int32 | None = crd_field(
        "Sub-groups that must be schedulable.", server_default=0, minimum=0
    )
    network_topology: VolcanoNetworkTopologySpec | None = crd_field("Topology constraint.")


class VolcanoPodGroupSpec(KubeModel):
    """Gang constraints for Volcano."""

    min_member: Int32 | None = crd_field("Pods that must be schedulable together.", minimum=0)
    min_task_member: dict[str, Int32] | None = crd_field("Minimum pods per task.")
    min_resources: dict[str, Quantity] | None = crd_field("Resources the whole gang needs.")
    queue: str | None = crd_field(
        "Volcano queue.", server_default="default", maxLength=253, pattern=DNS1123_SUBDOMAIN.pattern
    )
    priority_class_name: str | None = crd_field("Priority class of the gang.", maxLength=253)
    network_topology: VolcanoNetworkTopologySpec | None = crd_field("Topology constraint.")
    sub_group_policy: list[SubGroupPolicy] | None = crd_field("Sub-gangs.")


class VolcanoPodGroupCondition(KubeModel):
    type: str | None = crd_field("Condition type.")
    status: str | None = crd_field("True, False or Unknown.")
    transition_id: str | None = crd_field("Id of the transition.", alias="transitionID")
    last_transition_time: DateTime | None = crd_field("When the condition last changed.")
    reason: str | None = crd_field("Machine-readable reason.")
    message: str | None = crd_field("Human-readable message.")


class VolcanoPodGroupStatus(PodGroupCounts):
    phase: Literal["Pending", "Running", "Unknown", "Inqueue", "Completed"] | None = crd_field(
        "Phase of the PodGroup."
    )
    conditions: list[VolcanoPodGroupCondition] | None = crd_field("Conditions.")


class VolcanoPodGroup(KubeObject):
    """scheduling.volcano.sh/v1beta1 PodGroup."""

    API_VERSION: ClassVar[str | None] = c.VOLCANO_API_VERSION
    KIND: ClassVar[str | None] = c.POD_GROUP_KIND

    spec: VolcanoPodGroupSpec | None = crd_field("Gang constraints.")
    status: VolcanoPodGroupStatus | None = crd_field("Observed state.")


class NodeGroupAffinityTerms(KubeModel):
    """Node groups a queue's pods must or should run on."""

    required_during_scheduling_ignored_during_execution: list[str] | None = crd_field("Required node groups.")
    preferred_during_scheduling_ignored_during_execution: list[str] | None = crd_field("Preferred node groups.")


class QueueAffinity(KubeModel):
    """Node-group (anti-)affinity of a queue."""

    node_group_affinity: NodeGroupAffinityTerms | None = crd_field("Node groups to run on.")
    node_group_anti_affinity: NodeGroupAffinityTerms | None = crd_field("Node groups to avoid.")


class ExtendCluster(KubeModel):
    """A cluster a queue may extend to."""

    name: str | None = crd_field("Name of the cluster.")
    weight: Int32 | None = crd_field("Weight of the cluster.")
    capacity: dict[str, Quantity] | None = crd_field("Capacity in the cluster.")


class Guarantee(KubeModel):
    """Resources reserved for a queue."""

    resource: dict[str, Quantity] | None = crd_field("Reserved resources.")


class Reservation(KubeModel):
    """Nodes and resources locked for a queue."""

    nodes: list[str] | None = crd_field("Locked nodes.")
    resource: dict[str, Quantity] | None = crd_field("Locked resources.")


class VolcanoQueueStatus(KubeModel):
    """Observed state of a queue: podgroup counts per phase."""

    state: Literal["Open", "Closed", "Closing", "Unknown"] | None = crd_field("State of the queue.")
    pending: Int32 | None = crd_field("Pending podgroups.", minimum=0)
    running: Int32 | None = crd_field("Running podgroups.", minimum=0)
    inqueue: Int32 | None = crd_field("Podgroups in the queue.", minimum=0)
    completed: Int32 | None = crd_field("Completed podgroups.", minimum=0)
    unknown: Int32 | None = crd_field("Podgroups in an unknown phase.", minimum=0)
    allocated: dict[str, Quantity] | None = crd_field("Allocated resources.")
    reservation: Reservation | None = crd_field("Reservation.")


class VolcanoQueueSpec(KubeModel):
    """A Volcano queue: weight and capacity of a share of the cluster."""

    weight: Int32 | None = crd_field(
        "Share weight of the queue.", server_default=1, minimum=1, maximum=65535
    )
    capability: dict[str, Quantity] | None = crd_field("Upper bound of resources.")
    deserved: dict[str, Quantity] | None = crd_field("Resources the queue deserves.")
    guarantee: Guarantee | None = crd_field("Guaranteed resources.")
    affinity: QueueAffinity | None = crd_field("Node-group affinity.")
    extend_clusters: list[ExtendCluster] | None = crd_field("Clusters the queue may extend to.")
    reclaimable: bool | None = crd_field("Whether resources can be reclaimed.")
    parent: str | None = crd_field("Parent queue.", maxLength=253, pattern=DNS1123_SUBDOMAIN.pattern)
    priority: Int32 | None = crd_field("Queue priority.", minimum=0)
    type: str | None = crd_field("Queue type.", maxLength=253)
    dequeue_strategy: Literal["fifo", "traverse"] | None = crd_field(
        "Dequeue strategy.", server_default="traverse"
    )


class VolcanoQueue(KubeObject):
    """scheduling.volcano.sh/v1beta1 Queue (cluster-scoped)."""

    API_VERSION: ClassVar[str | None] = c.VOLCANO_API_VERSION
    KIND: ClassVar[str | None] = c.VOLCANO_QUEUE_KIND
    NAMESPACED: ClassVar[bool] = False

    spec: VolcanoQueueSpec | None = crd_field("Queue settings.")
    status: VolcanoQueueStatus | None = crd_field("Observed state.")

