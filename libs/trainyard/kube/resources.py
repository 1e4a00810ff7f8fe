"""The Kubernetes resources the services read and write, and their REST paths."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Resource:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None = None, name: str | None = None,
             subresource: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name:
            base += f"/{name}"
            if subresource:
                base += f"/{subresource}"
        return base


TRAINJOB = Resource("trainer.kubeflow.org", "v1alpha1", "trainjobs", "TrainJob")
TRAINING_RUNTIME = Resource("trainer.kubeflow.org", "v1alpha1", "trainingruntimes", "TrainingRuntime")
CLUSTER_TRAINING_RUNTIME = Resource(
    "trainer.kubeflow.org", "v1alpha1", "clustertrainingruntimes", "ClusterTrainingRuntime", False
)
JOBSET = Resource("jobset.x-k8s.io", "v1alpha2", "jobsets", "JobSet")
COSCHEDULING_PODGROUP = Resource("scheduling.x-k8s.io", "v1alpha1", "podgroups", "PodGroup")
VOLCANO_PODGROUP = Resource("scheduling.volcano.sh", "v1beta1", "podgroups", "PodGroup")
SECRET = Resource("", "v1", "secrets", "Secret")
CONFIGMAP = Resource("", "v1", "configmaps", "ConfigMap")
PRIORITY_CLASS = Resource("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", False)
HORIZONTAL_POD_AUTOSCALER = Resource("autoscaling", "v2", "horizontalpodautoscalers", "HorizontalPodAutoscaler")
EVENT = Resource("", "v1", "events", "Event")
NAMESPACE = Resource("", "v1", "namespaces", "Namespace", False)
NODE = Resource("", "v1", "nodes", "Node", False)
POD = Resource("", "v1", "pods", "Pod")
MULTIKUEUE_CLUSTER = Resource("kueue.x-k8s.io", "v1beta1", "multikueueclusters", "MultiKueueCluster", False)
VALIDATING_WEBHOOK_CONFIGURATION = Resource(
    "admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations",
    "ValidatingWebhookConfiguration", False,
)
MUTATING_WEBHOOK_CONFIGURATION = Resource(
    "admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations",
    "MutatingWebhookConfiguration", False,
)

KNOWN = [
    TRAINJOB, TRAINING_RUNTIME, CLUSTER_TRAINING_RUNTIME, JOBSET, COSCHEDULING_PODGROUP,
    VOLCANO_PODGROUP, SECRET, CONFIGMAP, PRIORITY_CLASS, EVENT, VALIDATING_WEBHOOK_CONFIGURATION,
    MUTATING_WEBHOOK_CONFIGURATION, NAMESPACE, NODE, POD, MULTIKUEUE_CLUSTER, HORIZONTAL_POD_AUTOSCALER,
]


def resource_for(api_version: str, kind: str) -> Resource:
    """The resource of an object's apiVersion/kind (only the kinds trainyard handles)."""
    for resource in KNOWN:
        if resource.api_version == api_version and resource.kind == kind:
            return resource
    raise KeyError(f"unsupported object kind: {kind} ({api_version})")
