"""Kueue's ``MultiKueueCluster`` (``kueue.x-k8s.io/v1beta1``): how a manager cluster declares a
worker cluster. trainyard reads the same objects Kueue does, so a Kueue user's worker
declarations carry over; the CRD is generated here only for clusters without Kueue."""
from __future__ import annotations

from typing import ClassVar, Literal

from trainyard.api.meta import Condition, KubeModel, KubeObject, crd_field

API_VERSION = "kueue.x-k8s.io/v1beta1"
KIND = "MultiKueueCluster"
# Key of the kubeconfig inside the Secret that ``spec.kubeConfig.location`` names (as Kueue).
KUBECONFIG_SECRET_KEY = "kubeconfig"


class KubeConfig(KubeModel):
    """Where the worker's kubeconfig is read from."""

    location_type: Literal["Secret", "Path"] | None = crd_field(
        "Secret: a Secret (in the dispatcher's secrets namespace) whose 'kubeconfig' key holds "
        "the kubeconfig; Path: a file on the dispatcher's filesystem.",
        server_default="Secret",
    )
    location: str = crd_field(
        "Name of the Secret, or the file path, holding the kubeconfig.", required=True, maxLength=256,
    )


class MultiKueueClusterSpec(KubeModel):
    kube_config: KubeConfig = crd_field("How to connect to the worker cluster.", required=True)


class MultiKueueClusterStatus(KubeModel):
    conditions: list[Condition] | None = crd_field(
        "Active: whether the worker cluster is reachable with its kubeconfig.",
        list_type="map", map_keys=["type"],
    )


class MultiKueueCluster(KubeObject):
    """A worker cluster of the manager (cluster-scoped)."""

    API_VERSION: ClassVar[str | None] = API_VERSION
    KIND: ClassVar[str | None] = KIND
    NAMESPACED: ClassVar[bool] = False

    spec: MultiKueueClusterSpec | None = crd_field("The worker's connection.")
    status: MultiKueueClusterStatus | None = crd_field("Observed state.")
